export function num(n: number | null | undefined, digits = 0): string {
  if (n === null || n === undefined || Number.isNaN(n)) return '–'
  if (Math.abs(n) >= 1e9) return (n / 1e9).toFixed(1) + 'G'
  if (Math.abs(n) >= 1e6) return (n / 1e6).toFixed(1) + 'M'
  if (Math.abs(n) >= 1e4) return (n / 1e3).toFixed(1) + 'k'
  return n.toFixed(digits)
}

export function pct(n: number | null | undefined): string {
  return n === null || n === undefined ? '–' : `${n.toFixed(n < 10 ? 1 : 0)}%`
}

/** "in 3h 20m" / "5m ago" for a Unix ms instant. */
export function rel(ms: number | null | undefined, now = Date.now()): string {
  if (!ms) return '–'
  const d = ms - now
  const a = Math.abs(d) / 1000
  let s: string
  if (a < 60) s = `${Math.round(a)}s`
  else if (a < 3600) s = `${Math.round(a / 60)}m`
  else if (a < 86400) s = `${Math.floor(a / 3600)}h ${Math.floor((a % 3600) / 60)}m`
  else s = `${Math.floor(a / 86400)}d ${Math.floor((a % 86400) / 3600)}h`
  return d >= 0 ? `in ${s}` : `${s} ago`
}

export function time(ms: number | null | undefined): string {
  if (!ms) return '–'
  return new Date(ms).toLocaleString()
}

export function tokens(t: { input_tokens: number; output_tokens: number }): number {
  return t.input_tokens + t.output_tokens
}
