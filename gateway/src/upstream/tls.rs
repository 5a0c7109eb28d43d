//! rustls client configuration for the upstream: webpki roots plus an optional private CA,
//! ALPN `h2` then `http/1.1`. The ring provider is installed once per process
//! ([`install_crypto_provider`]) because sqlx/reqwest and monoio-rustls both link rustls
//! (docs/io-traps.md#rustls-provider).

use std::{path::Path, sync::Arc};

/// Installs the ring provider as the process default (idempotent).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Builds the TLS connector for the upstream (ALPN `h2`, `http/1.1`).
pub fn connector(ca_file: Option<&Path>) -> Result<monoio_rustls::TlsConnector, String> {
    connector_with(ca_file, &[b"h2", b"http/1.1"])
}

/// The TLS connector for upstream WebSocket upgrades (ALPN `http/1.1` only: the upgrade is an
/// HTTP/1.1 request).
pub fn connector_h1(ca_file: Option<&Path>) -> Result<monoio_rustls::TlsConnector, String> {
    connector_with(ca_file, &[b"http/1.1"])
}

fn connector_with(
    ca_file: Option<&Path>,
    alpn: &[&[u8]],
) -> Result<monoio_rustls::TlsConnector, String> {
    install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(p) = ca_file {
        let pem = std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
        let mut n = 0;
        for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
            let cert = cert.map_err(|e| format!("bad PEM in {}: {e}", p.display()))?;
            roots
                .add(cert)
                .map_err(|e| format!("bad certificate in {}: {e}", p.display()))?;
            n += 1;
        }
        if n == 0 {
            return Err(format!("no certificate found in {}", p.display()));
        }
    }
    let mut cfg = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(monoio_rustls::TlsConnector::from(Arc::new(cfg)))
}
