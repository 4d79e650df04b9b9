// Test support: a throwaway network of Linux network namespaces — one per host, each with its own
// address — plus an address in the test's own namespace so the test can act as the client, with
// a one-way delay and a bandwidth cap on every host's egress. This kernel (like many CI and VM
// kernels) has no sch_netem, so the wire is userspace: one TUN device per host, joined by
// netrelay.py, which paces each sender at its rate and delivers after its delay. Needs root,
// iproute2, python3 and /dev/net/tun; `netLabUnavailable()` says what is missing. Traffic only goes
// to addresses inside these namespaces (198.18.0.0/15, the benchmarking range). Tests only.

/** A host of the lab. */
export interface LabHost {
  /** Short name given at creation ("prefill"). */
  name: string;
  /** Network namespace name. */
  ns: string;
  /** IPv4 address. */
  addr: string;
  /** Index of its TUN in the relay. */
  index: number;
}

/** Egress shaping of one host's link. */
export interface LinkShape {
  /** One-way delay added to what the host sends (ms); RTT between two hosts is twice this. */
  delayMs: number;
  /** Bandwidth cap of what the host sends, Mbit/s (0 = none). */
  rateMbit: number;
}

const PREFIX = "kvrt";
const MTU = "65000";
const RELAY = new URL("./netrelay.py", import.meta.url).pathname;

function ipSync(args: string[]): { ok: boolean; err: string } {
  try {
    const out = new Deno.Command("ip", { args, stdout: "null", stderr: "piped" }).outputSync();
    return { ok: out.success, err: new TextDecoder().decode(out.stderr).trim() };
  } catch (e) {
    return { ok: false, err: (e as Error).message };
  }
}

async function run(cmd: string, args: string[]): Promise<void> {
  const out = await new Deno.Command(cmd, { args, stdout: "null", stderr: "piped" }).output();
  if (!out.success) {
    throw new Error(`${cmd} ${args.join(" ")}: ${new TextDecoder().decode(out.stderr).trim()}`);
  }
}

/**
 * Why a lab cannot be built here (not root, no iproute2, python3 or /dev/net/tun, namespaces
 * refused), or null. Probes by creating and deleting one namespace.
 * @returns the reason, or null when labs work
 */
export function netLabUnavailable(): string | null {
  if (Deno.build.os !== "linux") return "network namespaces need Linux";
  if (Deno.uid() !== 0) return "network namespaces need root";
  for (const [bin, arg] of [["ip", "-V"], ["python3", "-V"]]) {
    try {
      new Deno.Command(bin, { args: [arg], stdout: "null", stderr: "null" }).outputSync();
    } catch {
      return `${bin} is not installed`;
    }
  }
  try {
    Deno.statSync("/dev/net/tun");
  } catch {
    return "/dev/net/tun is missing";
  }
  const probe = `${PREFIX}probe${Deno.pid}`;
  const made = ipSync(["netns", "add", probe]);
  if (!made.ok) return `cannot create a network namespace: ${made.err}`;
  ipSync(["netns", "del", probe]);
  return null;
}

/** Deletes namespaces left by a lab whose process is gone (a crashed or killed test run). */
function removeStaleLabs(): void {
  const out = new Deno.Command("ip", { args: ["netns", "list"], stdout: "piped", stderr: "null" })
    .outputSync();
  for (const line of new TextDecoder().decode(out.stdout).split("\n")) {
    const m = line.match(new RegExp(`^(${PREFIX}(\\d+)-[a-z]+)`));
    if (!m) continue;
    let alive = false;
    try {
      Deno.statSync(`/proc/${m[2]}`);
      alive = true;
    } catch { /* gone */ }
    if (!alive) ipSync(["netns", "del", m[1]]);
  }
}

/** A set of namespaced hosts on one userspace wire; always `await lab.destroy()` in a `finally`. */
export class NetLab {
  /** Hosts by name. */
  readonly hosts: Map<string, LabHost>;
  /** The test's own address. */
  readonly clientAddr: string;
  readonly #relay: Deno.ChildProcess;
  readonly #relayIn: WritableStreamDefaultWriter<Uint8Array>;
  readonly #relayOut: ReadableStreamDefaultReader<string>;
  readonly #children = new Set<Deno.ChildProcess>();
  #destroyed = false;
  #onSignal: () => void;

  private constructor(
    hosts: Map<string, LabHost>,
    clientAddr: string,
    relay: Deno.ChildProcess,
  ) {
    this.hosts = hosts;
    this.clientAddr = clientAddr;
    this.#relay = relay;
    this.#relayIn = relay.stdin.getWriter();
    this.#relayOut = relay.stdout.pipeThrough(new TextDecoderStream()).getReader();
    // An interrupted run still removes its namespaces (and kills its hosts' processes).
    this.#onSignal = () => {
      this.destroySync();
      Deno.exit(130);
    };
    Deno.addSignalListener("SIGINT", this.#onSignal);
    Deno.addSignalListener("SIGTERM", this.#onSignal);
  }

  async #relayLine(): Promise<string> {
    let buf = "";
    while (!buf.includes("\n")) {
      const r = await this.#relayOut.read();
      if (r.done) throw new Error("netrelay.py exited");
      buf += r.value;
    }
    return buf.trim();
  }

  /**
   * Builds the lab: the relay with one TUN per host and one for the test, each host's TUN moved
   * into its own namespace as eth0 (with `lo` up), the same shape on every host's egress.
   * @param names host names (at most 200)
   * @param shape egress delay and rate of every host
   * @returns the lab
   * @throws Error when a command fails (everything made so far is removed)
   */
  static async create(names: string[], shape: LinkShape): Promise<NetLab> {
    removeStaleLabs();
    const id = `${PREFIX}${Deno.pid}`;
    const net = `198.18.${Deno.pid % 250}`;
    const hosts = new Map<string, LabHost>();
    names.forEach((name, i) => {
      const tag = name.replace(/[^a-z]/g, "").slice(0, 8) || "host";
      hosts.set(name, { name, ns: `${id}-${tag}`, addr: `${net}.${i + 2}`, index: i + 1 });
    });
    const clientAddr = `${net}.1`;
    const tuns = [`${id}c`, ...names.map((_, i) => `${id}h${i}`)];
    const relay = new Deno.Command("python3", {
      args: [
        RELAY,
        JSON.stringify({
          names: tuns,
          addrs: [clientAddr, ...[...hosts.values()].map((h) => h.addr)],
          delay_ms: [0, ...names.map(() => shape.delayMs)],
          rate_bps: [0, ...names.map(() => shape.rateMbit * 1e6)],
        }),
      ],
      stdin: "piped",
      stdout: "piped",
      stderr: "inherit",
    }).spawn();
    const lab = new NetLab(hosts, clientAddr, relay);
    try {
      const first = await lab.#relayLine();
      if (first !== "ready") throw new Error(`netrelay.py: ${first}`);
      await run("ip", ["addr", "add", `${clientAddr}/24`, "dev", tuns[0]]);
      await run("ip", ["link", "set", tuns[0], "mtu", MTU, "up"]);
      for (const h of hosts.values()) {
        await run("ip", ["netns", "add", h.ns]);
        await run("ip", ["-n", h.ns, "link", "set", "lo", "up"]);
        await run("ip", ["link", "set", tuns[h.index], "netns", h.ns]);
        await run("ip", ["-n", h.ns, "link", "set", tuns[h.index], "name", "eth0"]);
        await run("ip", ["-n", h.ns, "addr", "add", `${h.addr}/24`, "dev", "eth0"]);
        await run("ip", ["-n", h.ns, "link", "set", "eth0", "mtu", MTU, "up"]);
      }
    } catch (e) {
      await lab.destroy();
      throw e;
    }
    return lab;
  }

  /**
   * Sets a host's egress delay and bandwidth cap.
   * @param host host name
   * @param shape delay and rate
   */
  async shape(host: string, shape: LinkShape): Promise<void> {
    const h = this.host(host);
    await this.#relayIn.write(
      new TextEncoder().encode(`shape ${h.index} ${shape.delayMs} ${shape.rateMbit * 1e6}\n`),
    );
    const ack = await this.#relayLine();
    if (ack !== "ok") throw new Error(`netrelay.py: ${ack}`);
  }

  /**
   * Takes a host's link down or up (the host vanishes from the network without closing its
   * connections: no RST, no FIN).
   * @param host host name
   * @param up true to bring it back
   */
  async link(host: string, up: boolean): Promise<void> {
    await run("ip", ["-n", this.host(host).ns, "link", "set", "eth0", up ? "up" : "down"]);
  }

  /**
   * The host named `name`.
   * @throws RangeError when there is none
   */
  host(name: string): LabHost {
    const h = this.hosts.get(name);
    if (!h) throw new RangeError(`no lab host "${name}"`);
    return h;
  }

  /**
   * Starts a process inside a host's namespace (`ip netns exec`, which execs it: the child's pid
   * is the command's). The lab kills it on destroy if it is still running.
   * @param host host name
   * @param cmd executable
   * @param args arguments
   * @param env extra environment
   * @returns the child (stdout discarded, stderr piped)
   */
  spawn(host: string, cmd: string, args: string[], env: Record<string, string> = {}) {
    const child = new Deno.Command("ip", {
      args: ["netns", "exec", this.host(host).ns, cmd, ...args],
      env,
      stdout: "null",
      stderr: "piped",
    }).spawn();
    this.#children.add(child);
    child.status.finally(() => this.#children.delete(child));
    return child;
  }

  /** Kills every process still running, stops the relay, deletes the namespaces (idempotent). */
  async destroy(): Promise<void> {
    for (const c of this.#children) {
      try {
        c.kill("SIGKILL");
      } catch { /* gone */ }
      await c.status.catch(() => {});
    }
    this.destroySync();
    await this.#relay.status.catch(() => {});
    await this.#relayOut.cancel().catch(() => {});
  }

  /** Kills processes and the relay and deletes namespaces without waiting (signal path too). */
  destroySync(): void {
    if (this.#destroyed) return;
    this.#destroyed = true;
    for (const c of this.#children) {
      try {
        c.kill("SIGKILL");
      } catch { /* gone */ }
    }
    this.#relayIn.close().catch(() => {});
    try {
      this.#relay.kill("SIGKILL");
    } catch { /* gone */ }
    for (const h of this.hosts.values()) ipSync(["netns", "del", h.ns]);
    Deno.removeSignalListener("SIGINT", this.#onSignal);
    Deno.removeSignalListener("SIGTERM", this.#onSignal);
  }
}
