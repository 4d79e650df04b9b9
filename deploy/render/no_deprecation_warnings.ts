// Imported first by deploy/render/main.ts: the manifest libraries' dependencies require Node's
// deprecated `punycode` module, whose DeprecationWarning would otherwise open every run's output.
// Affects only this tool's process.
import process from "node:process";

process.noDeprecation = true;
