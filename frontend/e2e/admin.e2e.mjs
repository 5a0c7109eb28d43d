// End-to-end test of the admin web app in a real browser (Debian's Chromium driven by
// playwright-core), against a running gateway. tests/tests/admin_browser.rs starts the stack
// and runs this script; it can also run by hand:
//
//   ADMIN_URL=http://127.0.0.1:8081 GATEWAY_URL=http://127.0.0.1:8080 ADMIN_PASSWORD=... \
//   AUTH_FILE=/path/auth.json IMPORT_ACCOUNT=acct-x DISABLE_ACCOUNT=acct-0 node e2e/admin.e2e.mjs
//
// Steps: log in; import an account file by drag and drop; create a key in the app and use it
// against the gateway; see the requests on the dashboard and in usage; disable an account
// and send more requests (the Rust side checks the upstream never saw that account again);
// change the scheduler strategy (and see an invalid value refused inline); the ops page shows
// every worker and the scheduler board (the data plane's candidate order), where an account
// the operator disables (MOVE_ACCOUNT) leaves the order and comes back. A screenshot of each page goes to SCREENSHOT_DIR. The last line printed is
// `RESULT {json}` for the Rust side.
import { chromium } from 'playwright-core'
import { mkdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'

const env = (k, d) => {
  const v = process.env[k] ?? d
  if (v === undefined) throw new Error(`${k} is required`)
  return v
}
const ADMIN = env('ADMIN_URL')
const GATEWAY = env('GATEWAY_URL')
const PASSWORD = env('ADMIN_PASSWORD')
const AUTH_FILE = env('AUTH_FILE')
const IMPORT_ACCOUNT = env('IMPORT_ACCOUNT')
const DISABLE_ACCOUNT = env('DISABLE_ACCOUNT')
const MOVE_ACCOUNT = env('MOVE_ACCOUNT', 'acct-1')
const BULK_FILE = env('BULK_FILE', '')
const BULK_COUNT = Number(env('BULK_COUNT', '0'))
const SHOTS = env('SCREENSHOT_DIR', 'target/admin-browser')
const CHROMIUM = env('CHROMIUM', '/usr/bin/chromium')
const T = 20_000

mkdirSync(SHOTS, { recursive: true })
const log = (...a) => console.log(`[e2e ${new Date().toISOString().slice(11, 23)}]`, ...a)

const browser = await chromium.launch({
  executablePath: CHROMIUM,
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
})
const result = {}
try {
  const context = await browser.newContext({ viewport: { width: 1440, height: 900 } })
  const page = await context.newPage()
  const consoleErrors = []
  page.on('console', (m) => m.type() === 'error' && consoleErrors.push(m.text()))
  page.on('pageerror', (e) => consoleErrors.push(String(e)))
  const shot = async (name) => {
    await page.waitForTimeout(300)
    await page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: false })
    log('screenshot', name)
  }
  const byTest = (id) => page.locator(`[data-testid="${id}"]`)

  // 1. Log in (a wrong password first: the error is shown, no session).
  await page.goto(ADMIN, { waitUntil: 'networkidle' })
  await byTest('password').fill('not the password')
  await byTest('login').click()
  await byTest('login-error').waitFor({ timeout: T })
  await shot('login')
  await byTest('password').fill(PASSWORD)
  await byTest('login').click()
  await byTest('nav-dashboard').waitFor({ timeout: T })
  const cookies = await context.cookies()
  const session = cookies.find((c) => c.name === 'cg_admin_session')
  if (!session || !session.httpOnly || session.sameSite !== 'Strict') {
    throw new Error(`session cookie not HttpOnly+Strict: ${JSON.stringify(session)}`)
  }
  const readable = await page.evaluate(() => document.cookie)
  if (readable.includes('cg_admin_session')) throw new Error('the session cookie is readable by scripts')
  log('logged in')

  // 2. Import an account file by drag and drop.
  await byTest('nav-accounts').click()
  await byTest('dropzone').waitFor({ timeout: T })
  const content = readFileSync(AUTH_FILE, 'utf8')
  const dt = await page.evaluateHandle((text) => {
    const d = new DataTransfer()
    d.items.add(new File([text], 'auth.json', { type: 'application/json' }))
    return d
  }, content)
  await byTest('dropzone').dispatchEvent('dragover', { dataTransfer: dt })
  await byTest('dropzone').dispatchEvent('drop', { dataTransfer: dt })
  await byTest('import-result').filter({ hasText: '1 added' }).waitFor({ timeout: T })
  await byTest(`account-${IMPORT_ACCOUNT}`).waitFor({ timeout: T })
  log('imported', IMPORT_ACCOUNT)

  // 2b. ChatGPT login (PKCE): the app shows the authorize URL; the operator pastes the URL the
  //     browser landed on (here: what the login would redirect to, with the mock's code).
  await byTest('oauth-start').click()
  const authorize = await byTest('oauth-url').getAttribute('href')
  const au = new URL(authorize)
  if (au.searchParams.get('code_challenge_method') !== 'S256' || !au.searchParams.get('code_challenge')) {
    throw new Error(`authorize URL without PKCE: ${authorize}`)
  }
  await byTest('oauth-callback').fill('http://localhost:1455/auth/callback?code=x&state=forged')
  await byTest('oauth-finish').click()
  await byTest('oauth-error').waitFor({ timeout: T })
  await byTest('oauth-callback').fill(`http://localhost:1455/auth/callback?code=account%3Aacct-oauth&scope=openid&state=${au.searchParams.get('state')}`)
  await byTest('oauth-finish').click()
  await byTest('account-acct-oauth').waitFor({ timeout: T })
  log('OAuth login added acct-oauth')
  await shot('accounts')

  // 3. Create a key (shown once) and use it against the gateway.
  await byTest('nav-api-keys').click()
  await byTest('key-name').fill('browser-e2e')
  await byTest('key-create').click()
  const key = (await byTest('new-key').textContent({ timeout: T })).trim()
  if (!key.startsWith('sk-')) throw new Error(`unexpected key ${key}`)
  await shot('keys-created')
  await byTest('key-done').click()
  let afterDisable = -1
  let lastRequestId = ''
  const ask = async (input) => {
    if (afterDisable >= 0) afterDisable++
    const r = await fetch(`${GATEWAY}/v1/responses`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-5.5', input, stream: false }),
    })
    if (r.status !== 200) throw new Error(`gateway answered ${r.status}: ${await r.text()}`)
    lastRequestId = r.headers.get('x-request-id') ?? ''
    return r.json()
  }
  const FIRST = 5
  for (let i = 0; i < FIRST; i++) await ask(`hello ${i}`)
  log('sent', FIRST, 'requests with the new key')

  // 4. The requests appear on the dashboard and in usage (polling, no reload).
  await byTest('nav-dashboard').click()
  await page.waitForFunction(
    (n) => Number(document.querySelector('[data-testid="stat-requests-1h"] .v')?.textContent ?? '0') >= n,
    FIRST, { timeout: T })
  await shot('dashboard')
  await byTest('nav-usage').click()
  await byTest('usage-group').selectOption('key')
  await byTest('usage-table').locator('tr', { hasText: 'browser-e2e' }).waitFor({ timeout: T })
  await shot('usage')
  // "Which request was that?": the last request found by the id the client got.
  if (!lastRequestId.startsWith('req_')) throw new Error(`no x-request-id: ${lastRequestId}`)
  await byTest('request-id-search').fill(lastRequestId)
  await byTest('request-id-find').click()
  await byTest('request-records').locator('tr', { hasText: 'browser-e2e' }).waitFor({ timeout: T })
  await shot('usage-request')
  log('request', lastRequestId, 'found by id on the usage page')
  await byTest('nav-api-keys').click()
  await byTest('key-browser-e2e').locator('[data-testid="key-requests"]').filter({ hasText: String(FIRST) }).waitFor({ timeout: T })
  log('usage visible on dashboard, usage and keys pages')

  // 4b. Key limits from the app: an invalid value is refused inline; saved limits show on the row.
  await byTest('key-browser-e2e').locator('[data-testid="key-edit"]').click()
  await byTest('limit-rpm').fill('0')
  await byTest('limits-save').click()
  await byTest('limits-error').waitFor({ timeout: T })
  await byTest('limit-rpm').fill('1000')
  await byTest('limit-tokens_per_day').fill('100000000')
  await byTest('limit-service_tier').selectOption('strip')
  await byTest('limits-save').click()
  await byTest('key-browser-e2e').locator('[data-testid="key-limits"]').filter({ hasText: '1000 rpm' }).waitFor({ timeout: T })
  await byTest('key-browser-e2e').locator('[data-testid="key-limits"]').filter({ hasText: 'fast tier: strip' }).waitFor({ timeout: T })
  await byTest('key-browser-e2e').locator('[data-testid="key-tokens-today"]').filter({ hasText: '/ 100.0M' }).waitFor({ timeout: T })
  await shot('keys-limits')
  log('key limits set in the app')

  // 5. Disable an account in the app; the gateway stops using it.
  await byTest('nav-accounts').click()
  const row = byTest(`account-${DISABLE_ACCOUNT}`)
  await row.locator('[data-testid="disable"]').click()
  await row.locator('[data-testid="status"]').filter({ hasText: 'disabled' }).waitFor({ timeout: T })
  afterDisable = 0
  const AFTER = 6
  for (let i = 0; i < AFTER; i++) await ask(`after disable ${i}`)
  log('disabled', DISABLE_ACCOUNT, 'and sent', AFTER, 'more requests')
  await shot('accounts-disabled')

  // 6. Settings: an invalid value is refused inline; the strategy change is hot.
  await byTest('nav-settings').click()
  await byTest('setting-max_attempts').fill('0')
  await byTest('settings-save').click()
  await byTest('error-max_attempts').waitFor({ timeout: T })
  await shot('settings-invalid')
  await byTest('setting-max_attempts').fill('3')
  await byTest('setting-strategy').selectOption('round_robin')
  await byTest('settings-save').click()
  await byTest('settings-msg').filter({ hasText: 'Saved' }).waitFor({ timeout: T })
  log('strategy set to round_robin')
  // The front door's settings: a bad allow-list entry is refused inline, a good list and a
  // per-IP rate are saved (this client, 127.0.0.1, stays on the list).
  await byTest('setting-ip_allow_list').fill('127.0.0.0/8, ::1, 10.0.0.300')
  await byTest('settings-save').click()
  await byTest('error-ip_allow_list').waitFor({ timeout: T })
  await byTest('setting-ip_allow_list').fill('127.0.0.0/8 ::1')
  await byTest('setting-per_ip_rps').fill('1000')
  await byTest('settings-save').click()
  await byTest('settings-msg').filter({ hasText: 'Saved' }).waitFor({ timeout: T })
  await page.waitForFunction(() => document.querySelector('[data-testid="setting-ip_allow_list"]')?.value === '127.0.0.0/8, ::1', null, { timeout: T })
  result.allow_list = await byTest('setting-ip_allow_list').inputValue()
  log('allow-list set to', result.allow_list)

  // 6b. Proxies: a bad URL is refused inline; a good one is listed without its password.
  await byTest('nav-proxies').click()
  await byTest('proxy-name').fill('e2e-proxy')
  await byTest('proxy-url').fill('ftp://nope')
  await byTest('proxy-create').click()
  await byTest('proxy-error').waitFor({ timeout: T })
  await byTest('proxy-url').fill('socks5://e2e:hidden-pw@127.0.0.1:1')
  await byTest('proxy-create').click()
  await byTest('proxy-e2e-proxy').waitFor({ timeout: T })
  result.proxy_row = await byTest('proxy-e2e-proxy').textContent()
  await shot('proxies')
  log('proxy added')

  // 6b'. Batch test of one account from the app: straight to the upstream, one result row.
  await byTest('nav-accounts').click()
  await byTest(`account-${MOVE_ACCOUNT}`).locator('input[type="checkbox"]').check()
  await byTest('bulk-test').click()
  await byTest('test-results').locator('tbody tr').filter({ hasText: 'ok' }).first().waitFor({ timeout: T })
  result.test_results = await byTest('test-results').textContent()
  await byTest(`account-${MOVE_ACCOUNT}`).locator('input[type="checkbox"]').uncheck()
  log('batch test shown')

  // 6c. The audit log lists what the app just did (the proxy's password redacted).
  await byTest('nav-audit').click()
  await byTest('audit-table').locator('tr').filter({ hasText: 'proxies.create' }).first().waitFor({ timeout: T })
  result.audit_table = await byTest('audit-table').textContent()
  await shot('audit')
  log('audit log shown')

  // 7. Ops: every worker with its driver; the strategy is the new one.
  await byTest('nav-ops').click()
  await byTest('ops-strategy').filter({ hasText: 'round_robin' }).waitFor({ timeout: T })
  await page.waitForFunction(() => Number(document.querySelector('[data-testid="worker-count"]')?.textContent ?? '0') > 0, null, { timeout: T })
  result.workers = Number(await byTest('worker-count').textContent())

  // 7b. The scheduler board: the candidate order as the page shows it; an account disabled in
  //     the app leaves the order (no position, after every candidate) and comes back.
  const board = () => page.$$eval('[data-testid="board"] tbody tr', (rows) => rows.map((r) => ({
    id: (r.getAttribute('data-testid') ?? '').replace(/^board-/, ''),
    position: r.querySelector('[data-testid="board-position"]')?.textContent?.trim() ?? '',
    tier: r.querySelector('[data-testid="board-tier"]')?.textContent?.trim() ?? null,
  })))
  const position = (id) => page.waitForFunction(([id, want]) => {
    const c = document.querySelector(`[data-testid="board-${id}"] [data-testid="board-position"]`)
    return c !== null && (c.textContent.trim() === '–') === want
  }, [MOVE_ACCOUNT, id], { timeout: T })
  await position(false)
  result.board_before = await board()
  await byTest('nav-accounts').click()
  const moved = byTest(`account-${MOVE_ACCOUNT}`)
  await moved.locator('[data-testid="disable"]').click()
  await moved.locator('[data-testid="status"]').filter({ hasText: 'disabled' }).waitFor({ timeout: T })
  await byTest('nav-ops').click()
  await position(true)
  result.board_disabled = await board()
  await byTest('nav-accounts').click()
  await moved.locator('[data-testid="enable"]').click()
  await moved.locator('[data-testid="status"]').filter({ hasText: 'active' }).waitFor({ timeout: T })
  await byTest('nav-ops').click()
  await position(false)
  result.board_enabled = await board()
  log('board before/disabled/enabled', JSON.stringify([result.board_before, result.board_disabled, result.board_enabled]))
  await Promise.all(Array.from({ length: 12 }, (_, i) => ask(`ops traffic ${i}`)))
  await page.waitForTimeout(1500)
  await shot('ops')
  await byTest('nav-dashboard').click()
  await page.waitForTimeout(2500)
  await shot('dashboard')

  // 8. A thousand-plus accounts: import one file, filter, select all, disable in bulk; the
  //    table renders a window of rows and sorts at once.
  if (BULK_FILE) {
    await byTest('nav-accounts').click()
    const big = readFileSync(BULK_FILE, 'utf8')
    const dt2 = await page.evaluateHandle((text) => {
      const d = new DataTransfer()
      d.items.add(new File([text], 'bulk-accounts.json', { type: 'application/json' }))
      return d
    }, big)
    const t0 = Date.now()
    await byTest('dropzone').dispatchEvent('drop', { dataTransfer: dt2 })
    await byTest('import-result').filter({ hasText: `${BULK_COUNT} added` }).waitFor({ timeout: 60_000 })
    log('imported', BULK_COUNT, 'accounts in', Date.now() - t0, 'ms')
    await byTest('search').fill('bulk-')
    await byTest('account-bulk-0000').waitFor({ timeout: T })
    await page.locator('[data-testid="accounts-table"] thead input[type="checkbox"]').check()
    await page.getByText(`${BULK_COUNT} selected`).first().waitFor({ timeout: T })
    const t1 = Date.now()
    await byTest('bulk-disable').click()
    await byTest('toast').filter({ hasText: `disable: ${BULK_COUNT} done` }).waitFor({ timeout: 60_000 })
    log('bulk-disabled', BULK_COUNT, 'accounts in', Date.now() - t1, 'ms')
    await byTest('search').fill('')
    const t2 = Date.now()
    await page.locator('[data-testid="accounts-table"] th', { hasText: '5 h quota' }).click()
    await page.locator('[data-testid="accounts-table"] th', { hasText: 'Account' }).first().click()
    result.sort_ms = Date.now() - t2
    result.rows_in_dom = await page.locator('[data-testid="accounts-table"] tbody tr[data-testid^="account-"]').count()
    await page.locator('.vscroll').evaluate((el) => { el.scrollTop = el.scrollHeight / 2 })
    await page.waitForTimeout(300)
    await shot('accounts-1200')
    log('rows in the DOM:', result.rows_in_dom, 'sort took', result.sort_ms, 'ms')
  }

  // 9. Log out: the API is closed again.
  await byTest('logout').click()
  await byTest('login-form').waitFor({ timeout: T })
  const anon = await page.evaluate(async () => (await fetch('/api/admin/accounts')).status)
  if (anon !== 401) throw new Error(`after logout the API answered ${anon}`)
  result.sent_after_disable = afterDisable
  // The expected 401 (wrong password) and 400 (invalid setting) answers are logged by the
  // browser as failed loads; anything else is a script error.
  result.console_errors = consoleErrors.filter((e) => !/status of (400|401)/.test(e))
  result.ok = true
} finally {
  await browser.close()
}
console.log(`RESULT ${JSON.stringify(result)}`)
