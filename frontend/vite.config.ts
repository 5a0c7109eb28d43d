import { defineConfig } from 'vite'
import vue from '@vitejs/plugin-vue'

// `npm run dev` proxies the API to a gateway's admin listener (CODEX_GATEWAY_ADMIN, default
// 127.0.0.1:8081); `npm run build` writes dist/, which admin/build.rs embeds in the binary.
export default defineConfig({
  plugins: [vue()],
  base: '/',
  build: {
    outDir: 'dist',
    assetsDir: 'assets',
    emptyOutDir: true,
    sourcemap: false,
    chunkSizeWarningLimit: 600,
  },
  server: {
    proxy: {
      '/api': `http://${process.env.CODEX_GATEWAY_ADMIN ?? '127.0.0.1:8081'}`,
    },
  },
})
