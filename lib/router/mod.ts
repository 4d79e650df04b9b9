// Public face of lib/router: tier choice per request (explicit, rules, default, sticky).
export {
  type Conversation,
  DEFAULT_RULES,
  type RouteDecision,
  Router,
  type RouteReason,
  type RouterOptions,
} from "./router.ts";
