// The admin API client: same-origin fetch with the session cookie (HttpOnly, set by
// POST /api/admin/login), JSON bodies on every mutation (the server refuses anything else),
// and errors in the API's {"error":{message,type,code,param,errors}} shape.
import { ref } from 'vue'

export const loggedIn = ref<boolean | null>(null)

export class ApiError extends Error {
  status: number
  code: string
  param?: string
  errors?: Record<string, string>
  constructor(status: number, body: any) {
    const e = body?.error ?? {}
    super(e.message ?? `HTTP ${status}`)
    this.status = status
    this.code = e.code ?? 'error'
    this.param = e.param
    this.errors = e.errors
  }
}

async function call<T>(method: string, path: string, body?: unknown): Promise<T> {
  const init: RequestInit = { method, credentials: 'same-origin', headers: {} }
  if (method !== 'GET') {
    ;(init.headers as Record<string, string>)['content-type'] = 'application/json'
    init.body = JSON.stringify(body ?? {})
  }
  const resp = await fetch(`/api/admin${path}`, init)
  const text = await resp.text()
  const json = text ? JSON.parse(text) : null
  if (!resp.ok) {
    if (resp.status === 401 && path !== '/login') loggedIn.value = false
    throw new ApiError(resp.status, json)
  }
  return json as T
}

export const api = {
  get: <T>(p: string) => call<T>('GET', p),
  post: <T>(p: string, b?: unknown) => call<T>('POST', p, b),
  put: <T>(p: string, b?: unknown) => call<T>('PUT', p, b),
  patch: <T>(p: string, b?: unknown) => call<T>('PATCH', p, b),
  del: <T>(p: string) => call<T>('DELETE', p),
}

export interface List<T> { object: 'list'; data: T[] }

export interface Totals {
  requests: number; input_tokens: number; cached_tokens: number
  output_tokens: number; reasoning_tokens: number; errors: number
}

export interface Health {
  error_rate: number; first_token_ms: number; consecutive_failures: number
  consecutive_successes: number; last_request_ms: number; excluded_models: string[]; tier: string
}

export interface Account {
  id: number; chatgpt_account_id: string; email: string | null; label: string; plan: string | null
  status: string; effective_status: string; schedulable: boolean; weight: number; max_concurrency: number
  in_flight: number; served: number; failures: number; cooldown_until: number | null
  cooldown_reason: string | null; primary_used_pct: number | null; primary_reset_at: number | null
  secondary_used_pct: number | null; secondary_reset_at: number | null; access_expires_at: number | null
  last_refresh_at: number | null; refresh_in_flight: boolean; health: Health; created_at: number
  account_group: string | null; reset_credits?: number | null
}

export interface KeyLimits {
  rpm: number | null; max_concurrency: number | null; tokens_per_day: number | null
  tokens_per_month: number | null; cost_per_day_usd: number | null; cost_per_month_usd: number | null
  allowed_models: string[]; account_group: string | null; expires_at: number | null; enabled: boolean
  /** pass / strip / refuse; null: the global service_tier setting. */
  service_tier: 'pass' | 'strip' | 'refuse' | null
}

export interface KeyPeriod { requests: number; tokens: number; cost_usd: number }

export interface Key {
  id: number; name: string; key_prefix: string; created_at: number; revoked_at: number | null
  revoked: boolean; usage_24h: Totals; usage_total: Totals; key?: string
  last_used_at: number | null; usable: boolean; limits: KeyLimits; today: KeyPeriod; month: KeyPeriod
  in_flight: number
}

export interface AdminToken {
  id: number; name: string; token_prefix: string; created_at: number; last_used_at: number | null
  revoked: boolean; scope: 'admin' | 'read'; expires_at: number | null; expired: boolean; token?: string
}

export interface Failure {
  id: number; key_id: number; account_id: number | null; route: string; model: string; status: number
  error_code: string | null; started_at_ms: number; latency_ms: number; key_name: string | null
  account_label: string | null; error_class: string | null; request_id: string | null
}

/** One stored usage record, every field (`GET /usage/records?request_id=`). */
export interface UsageRecordRow {
  id: number; record_id: string | null; request_id: string | null; started_at_ms: number
  key_id: number; key_name: string | null; account_id: number | null; account_label: string | null
  route: string; model: string; transport: string | null; status: number; stream: boolean
  input_tokens: number; cached_tokens: number; output_tokens: number; reasoning_tokens: number
  ttfb_ms: number | null; ttft_ms: number | null; latency_ms: number; failovers: number
  error_code: string | null; error_class: string | null; cost_micros: number
}

export interface DataPlane {
  reachable: boolean; error?: string; requests_per_s: number; errors_per_s: number
  attempts_per_s: number; requests_total: number; errors_total: number; open_streams: number
  ws_sessions: number; failovers_total: number
}

export interface ForecastWindow {
  used_pct: number; reset_at_ms: number | null; burn_pct_per_hour: number
  burn_source: 'account' | 'plan' | 'none'; exhausts_at_ms: number | null
}
export interface ForecastAccount {
  id: number; label: string; plan: string; counted: boolean; schedulable: boolean
  primary: ForecastWindow; secondary: ForecastWindow
  exhausts_at_ms: number | null; binding: 'primary' | 'secondary' | null; capacity_returns_at_ms: number | null
  /** Reset credits as last polled (null: not polled yet); credits_used: spent by the forecast. */
  reset_credits: number | null; credits_used: number
}
export interface Forecast {
  now_ms: number; lookback_s: number
  pool: { accounts: number; available_now: number; demand_pct_per_hour: number
    exhausts_at_ms: number | null; capacity_returns_at_ms: number | null
    reset_credits: number; credits_used: number; exhausts_without_credits_at_ms: number | null }
  plans: { plan: string; accounts: number; observed: number; burn_primary_pct_per_hour: number; burn_secondary_pct_per_hour: number }[]
  accounts: ForecastAccount[]
}

export interface Dashboard {
  now_ms: number; storage_up: boolean; snapshot_version: number; strategy: string
  data_plane: DataPlane; usage_5m: Totals; usage_1h: Totals; usage_24h: Totals
  pool: { accounts: number; schedulable: number; active: number; cooling: number; disabled: number
    reauth_required: number; banned: number; in_flight: number }
  quota: { mean_primary_used_pct: number; mean_secondary_used_pct: number
    burn_pct_per_hour: number | null; dry_at_ms: number | null; next_reset_at: number | null }
  recent_failures: Failure[]
}

export interface Series {
  id: string; label: string; requests: number[]; tokens: number[]; errors: number[]; totals: Totals
}

export interface SeriesView {
  group_by: string; bucket_ms: number; since_ms: number; until_ms: number; buckets: number[]
  series: Series[]; totals: Totals
}

/** The scheduler's own view of one account (`gateway::scheduler::board`). */
export interface SchedulerEntry {
  account_id: number; position: number | null; tier: string; score: number; penalty: number
  limit: number; in_flight: number; deferred: boolean
}
export interface Ops {
  now_ms: number; snapshot_version: number; strategy: string; data_plane: DataPlane
  workers: { id: number; driver: string; metrics: Record<string, number> }[]
  board_by_scheduler: boolean
  board: (Account & { rank: number; scheduler: SchedulerEntry | null })[]; board_truncated: number
}

export interface ImportSummary {
  added: string[]; updated: string[]; skipped: { source: string; reason: string }[]
}

export interface AuditEntry {
  id: number; at: number; actor: string; source: string | null; action: string
  object_type: string | null; object_id: string | null; status: number
  details: unknown; before: unknown; after: unknown
}

export interface AccountTestResult {
  id: number; label: string | null; ok: boolean; status: number | null
  ttfb_ms: number | null; latency_ms: number; error_class: string | null; message: string | null
}
