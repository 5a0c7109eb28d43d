import { onMounted, onUnmounted } from 'vue'

/** Runs `fn` now and every `ms` while the component is mounted and the tab is visible. */
export function usePoll(fn: () => Promise<unknown> | unknown, ms: number) {
  let timer: number | undefined
  let busy = false
  const tick = async () => {
    if (busy || document.hidden) return
    busy = true
    try {
      await fn()
    } catch {
      // shown by the page's own error state
    } finally {
      busy = false
    }
  }
  onMounted(() => {
    tick()
    timer = window.setInterval(tick, ms)
  })
  onUnmounted(() => window.clearInterval(timer))
  return tick
}
