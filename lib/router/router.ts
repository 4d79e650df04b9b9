// Tier routing: an explicit model/tier wins; else the first matching rule (token count bounds,
// keywords); else the default tier. Escalation is sticky per conversation (user id) so a
// conversation only moves up. It picks names only — loading models and migrating caches is
// the functions' job.
import type { RouteRule } from "../config/mod.ts";

/** The seed's length/keyword heuristic, used when a config gives no rules. */
export const DEFAULT_RULES: readonly RouteRule[] = [
  {
    tier: "powerful",
    keywords: ["explain", "analyze", "analyse", "prove", "why", "compare", "reason", "step"],
  },
  { tier: "powerful", min_tokens: 96 },
  { tier: "balanced", keywords: ["summarize", "summarise", "describe", "write", "story"] },
  { tier: "balanced", min_tokens: 32 },
];

/** Why a tier was chosen. */
export type RouteReason = "explicit" | "rule" | "default" | "sticky";

/** A routing decision. */
export interface RouteDecision {
  tier: string;
  reason: RouteReason;
  /** Index of the matching rule when reason is "rule". */
  rule?: number;
  /** The tier the conversation used last (when known). */
  previousTier?: string;
}

/** Router options. */
export interface RouterOptions {
  /** Tier names, lowest to highest. */
  tiers: readonly string[];
  /** Tier when nothing matches. */
  defaultTier: string;
  /** Ordered rules (default {@link DEFAULT_RULES}, dropping rules naming absent tiers). */
  rules?: readonly RouteRule[];
  /** Never move a user's conversation to a lower tier than its last (default true). */
  sticky?: boolean;
  /** Conversations remembered (LRU, default 10000). */
  maxConversations?: number;
}

function words(text: string): Set<string> {
  return new Set(text.toLowerCase().split(/[^\p{L}\p{N}]+/u).filter((w) => w.length > 0));
}

/** Picks a tier per request; remembers each user's last tier for sticky escalation. */
export class Router {
  readonly tiers: readonly string[];
  readonly defaultTier: string;
  readonly rules: readonly RouteRule[];
  readonly #sticky: boolean;
  readonly #max: number;
  readonly #last = new Map<string, string>();

  /**
   * @param opts tiers, default tier, rules, stickiness
   * @throws {RangeError} when the default tier or a configured rule names an unknown tier
   */
  constructor(opts: RouterOptions) {
    this.tiers = [...opts.tiers];
    if (!this.tiers.includes(opts.defaultTier)) {
      throw new RangeError(
        `default tier "${opts.defaultTier}" is not one of ${this.tiers.join(", ")}`,
      );
    }
    this.defaultTier = opts.defaultTier;
    if (opts.rules) {
      opts.rules.forEach((r, i) => {
        if (!this.tiers.includes(r.tier)) {
          throw new RangeError(`rules[${i}] names unknown tier "${r.tier}"`);
        }
      });
      this.rules = [...opts.rules];
    } else {
      this.rules = DEFAULT_RULES.filter((r) => this.tiers.includes(r.tier));
    }
    this.#sticky = opts.sticky ?? true;
    this.#max = opts.maxConversations ?? 10000;
  }

  /** Rank of a tier (0 = lowest), -1 when unknown. */
  rank(tier: string): number {
    return this.tiers.indexOf(tier);
  }

  /**
   * Chooses the tier for a request.
   * @param req `prompt` text, its token count, an explicit tier (wins), the user id
   * @returns the decision (call {@link Router.commit} once the request ran)
   */
  route(
    req: { prompt: string; promptTokens: number; explicit?: string; userId?: string },
  ): RouteDecision {
    const previousTier = req.userId === undefined ? undefined : this.#last.get(req.userId);
    if (req.explicit !== undefined) return { tier: req.explicit, reason: "explicit", previousTier };
    let decision: RouteDecision | undefined;
    const w = words(req.prompt);
    for (let i = 0; i < this.rules.length && !decision; i++) {
      const r = this.rules[i];
      if (r.min_tokens !== undefined && req.promptTokens < r.min_tokens) continue;
      if (r.max_tokens !== undefined && req.promptTokens > r.max_tokens) continue;
      if (r.keywords && !r.keywords.some((k) => w.has(k.toLowerCase()))) continue;
      decision = { tier: r.tier, reason: "rule", rule: i, previousTier };
    }
    decision ??= { tier: this.defaultTier, reason: "default", previousTier };
    if (
      this.#sticky && previousTier !== undefined &&
      this.rank(previousTier) > this.rank(decision.tier)
    ) {
      return { tier: previousTier, reason: "sticky", previousTier };
    }
    return decision;
  }

  /**
   * Records the tier a user's request ran on.
   * @param userId the conversation's user id
   * @param tier the tier used
   */
  commit(userId: string | undefined, tier: string): void {
    if (userId === undefined) return;
    this.#last.delete(userId);
    this.#last.set(userId, tier);
    if (this.#last.size > this.#max) this.#last.delete(this.#last.keys().next().value!);
  }
}
