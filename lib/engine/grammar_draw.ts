// How a generation's draws meet its grammar (structured output): which draws are masked before
// they are taken and which are taken unmasked and redrawn under the mask only when the grammar
// rejects their token. Both give the masked draw's result where it applies (redrawIsExact); the
// choice is about cost. A mask is cheap where the grammar allows few tokens (punctuation, keys,
// enum values) and expensive where it allows most (inside a length-bounded string: hundreds of µs
// on the demo vocabulary), and the model's own token is usually rejected in the first kind of
// state and accepted in the second. A greedy row also draws narrow states first while the
// grammar keeps accepting its tokens there (a model that writes JSON: no mask at all), and goes
// back to masking them when it does not (then an occasional probe). Not the mask itself
// (lib/grammar) nor the draw (the sampler).

import type { LogprobRequest, NativeSampler, SampleResult } from "../native/mod.ts";
import type { TokenMask } from "./sampling.ts";
import type { TokenGrammar } from "./generate.ts";

/** Whether a mask allows at least half of its tokens: the next token is drawn first then. */
export function allowsMost(mask: TokenMask): boolean {
  let allowed = 0;
  for (const word of mask.words) {
    let w = word - ((word >>> 1) & 0x55555555);
    w = (w & 0x33333333) + ((w >>> 2) & 0x33333333);
    allowed += (((w + (w >>> 4)) & 0x0f0f0f0f) * 0x01010101) >>> 24;
  }
  return allowed * 2 >= mask.nTokens;
}

/** Greedy rows draw first in a narrow state while at least this share of their recent narrow
 *  draws was accepted unmasked (a running average; a rejection costs an argmax and a redraw, an
 *  acceptance saves a mask). */
const NARROW_DRAW_FIRST = 0.5;
/** Below it, every this many narrow draws one is drawn first anyway, to see whether the model
 *  follows the grammar again. */
const NARROW_PROBE_EVERY = 16;

/** One generation's grammar and sampler: prepares each draw, then has the grammar take it. */
export class GrammarDraws {
  readonly #grammar: TokenGrammar;
  readonly #sampler: NativeSampler;
  readonly #drawFirst: boolean;
  readonly #greedy: boolean;
  /** drawing first: whether the grammar's last known state allowed most tokens */
  #wide = false;
  /** greedy: the running share of narrow-state draws the grammar accepted unmasked */
  #narrowAccepted = 1;
  #narrowMasked = 0;
  /** whether the draw in flight is a narrow-state draw taken first */
  #narrowTrial = false;

  /**
   * @param grammar the generation's grammar
   * @param sampler the generation's sampler (its mask and kept rows are set here)
   * @param drawFirst whether draw-then-redraw is exact for the sampler's settings (redrawIsExact)
   * @param greedy whether the sampler is greedy: then narrow states may be drawn first too (a
   *   sampled draw first would replace the masked draw's few exps by one per token)
   */
  constructor(grammar: TokenGrammar, sampler: NativeSampler, drawFirst: boolean, greedy = false) {
    this.#grammar = grammar;
    this.#sampler = sampler;
    this.#drawFirst = drawFirst;
    this.#greedy = greedy;
  }

  /** Whether the next draw is taken first (unmasked). */
  #firstNow(): boolean {
    if (!this.#drawFirst) return false;
    if (this.#wide) return true;
    if (!this.#greedy) return false;
    if (this.#narrowAccepted >= NARROW_DRAW_FIRST) return true;
    return ++this.#narrowMasked % NARROW_PROBE_EVERY === 0;
  }

  /** Sets the sampler for the next draw: the grammar's mask, or (drawing first) no mask and the
   *  row kept for a redraw. */
  async beforeDraw(): Promise<void> {
    const s = this.#sampler;
    if (this.#firstNow()) {
      this.#narrowTrial = !this.#wide;
      if (s.masked) s.setMask(null);
      if (!s.keepsRows) s.keepRow(true);
      return;
    }
    this.#narrowTrial = false;
    const mask = await this.#grammar.nextMask();
    s.setMask(mask);
    if (this.#drawFirst) {
      if (s.keepsRows) s.keepRow(false);
      this.#wide = allowsMost(mask);
    }
  }

  /**
   * Has the grammar take a draw made after {@link beforeDraw}: a token drawn first that the
   * grammar rejects is replaced by a draw from the same row under the grammar's mask.
   * @param r the draw
   * @param req the logprobs it was asked for (a redraw returns them too)
   * @returns the draw the grammar took
   * @throws Error when the grammar rejects a token its mask allowed (an engine fault)
   */
  async take(r: SampleResult, req?: LogprobRequest): Promise<SampleResult> {
    const accepted = this.#grammar.accept(r.token);
    if (this.#narrowTrial) {
      this.#narrowAccepted = 0.8 * this.#narrowAccepted + (accepted ? 0.2 : 0);
    }
    if (accepted) return r;
    const s = this.#sampler;
    if (s.keepsRows && !s.masked) {
      const mask = await this.#grammar.nextMask();
      this.#wide = allowsMost(mask);
      s.setMask(mask);
      r = s.redraw(req);
      if (this.#grammar.accept(r.token)) return r;
    }
    throw new Error(`the grammar rejected token ${r.token}, which its mask allowed`);
  }
}
