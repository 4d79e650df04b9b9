// Tier routing: an explicit model/tier wins; else the first matching rule (token count bounds,
// keywords); else the default tier. Escalation is sticky per conversation — a (tenant, user id)
// pair, so one tenant's user ids never see or pin another's — and a conversation only moves up.
// It picks names only — loading models and migrating caches is the functions' job.
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

/** Whose conversation a request continues: user ids are the client's names, scoped by tenant. */
export interface Conversation {
  /** The authenticated tenant (API key's tenant). */
  tenant: string;
  /** The client-chosen user id. */
  user: string;
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
  /** Conversations remembered, all tenants together (default 10000). When full, the least
   *  recently used conversation of the tenant holding the most is forgotten (the inserting one
   *  on a tie), so a tenant only ever loses entries it holds beyond an equal share. */
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
  // tenant → (user → last tier), each map in least-recently-used-first order
  readonly #last = new Map<string, Map<string, string>>();
  #size = 0;

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
   * @param req `prompt` text, its token count, an explicit tier (wins), the conversation
   * @returns the decision (call {@link Router.commit} once the request ran)
   */
  route(
    req: { prompt: string; promptTokens: number; explicit?: string; conversation?: Conversation },
  ): RouteDecision {
    const c = req.conversation;
    const previousTier = c === undefined ? undefined : this.#last.get(c.tenant)?.get(c.user);
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
   * Records the tier a conversation's request ran on.
   * @param conversation the (tenant, user id) pair; undefined records nothing
   * @param tier the tier used
   */
  commit(conversation: Conversation | undefined, tier: string): void {
    if (conversation === undefined) return;
    const { tenant, user } = conversation;
    let mine = this.#last.get(tenant);
    if (mine === undefined) this.#last.set(tenant, mine = new Map());
    if (!mine.delete(user)) this.#size++;
    mine.set(user, tier);
    if (this.#size <= this.#max) return;
    // Evict from the largest tenant; the committing tenant evicts its own entry on a tie.
    let victim = mine;
    for (const m of this.#last.values()) if (m.size > victim.size) victim = m;
    victim.delete(victim.keys().next().value!);
    this.#size--;
    if (victim.size === 0) {
      for (const [t, m] of this.#last) if (m === victim) this.#last.delete(t);
    }
  }
}
