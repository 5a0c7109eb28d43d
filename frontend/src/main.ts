import { createApp } from 'vue'
import { createRouter, createWebHistory } from 'vue-router'
import App from './App.vue'
import Dashboard from './pages/Dashboard.vue'
import Accounts from './pages/Accounts.vue'
import Keys from './pages/Keys.vue'
import Usage from './pages/Usage.vue'
import Ops from './pages/Ops.vue'
import Settings from './pages/Settings.vue'
import Proxies from './pages/Proxies.vue'
import Audit from './pages/Audit.vue'
import './style.css'

const router = createRouter({
  history: createWebHistory(),
  routes: [
    { path: '/', component: Dashboard, meta: { title: 'Dashboard' } },
    { path: '/accounts', component: Accounts, meta: { title: 'Accounts' } },
    { path: '/keys', component: Keys, meta: { title: 'API keys' } },
    { path: '/usage', component: Usage, meta: { title: 'Usage' } },
    { path: '/ops', component: Ops, meta: { title: 'Ops' } },
    { path: '/settings', component: Settings, meta: { title: 'Settings' } },
    { path: '/proxies', component: Proxies, meta: { title: 'Proxies' } },
    { path: '/audit', component: Audit, meta: { title: 'Audit log' } },
    { path: '/:rest(.*)*', redirect: '/' },
  ],
})
router.afterEach((to) => {
  document.title = `${(to.meta.title as string) ?? 'Admin'} · codex-gateway`
})

createApp(App).use(router).mount('#app')
