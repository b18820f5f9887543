//! A throwaway certificate authority and a server certificate for the TLS cases, made with
//! `rcgen` for one run and written as a user's files would be (the private key 0600, by
//! [`write_private`], which also writes the benches' key files).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};

/// The PEM files of [`write()`]: the CA certificate, and the server's certificate and key.
pub struct Certs {
    /// The CA certificate (PEM): what a client trusts.
    pub ca: PathBuf,
    /// The server certificate (PEM), signed by the CA.
    pub cert: PathBuf,
    /// The server certificate's private key (PEM, mode 0600).
    pub key: PathBuf,
}

/// A CA and a certificate it signed for `names` (its subject alternative names: IP addresses
/// or DNS names), under `dir` as `ca.crt`, `server.crt` and `server.key`.
pub fn write(dir: &Path, names: &[String]) -> Result<Certs> {
    let ca_key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = params.self_signed(&ca_key)?;
    let key = KeyPair::generate()?;
    let cert = CertificateParams::new(names.to_vec())?.signed_by(&key, &ca, &ca_key)?;
    let certs = Certs {
        ca: dir.join("ca.crt"),
        cert: dir.join("server.crt"),
        key: dir.join("server.key"),
    };
    std::fs::write(&certs.ca, ca.pem())?;
    std::fs::write(&certs.cert, cert.pem())?;
    write_private(&certs.key, key.serialize_pem().as_bytes())?;
    Ok(certs)
}

/// The TLS configurations of a server on 127.0.0.1 and its clients (replicas).
pub struct LoopbackTls {
    /// The server's: its certificate and key.
    pub server: Arc<rustls::ServerConfig>,
    /// A client's: the CA the server's certificate chains to.
    pub client: Arc<rustls::ClientConfig>,
}

/// A CA and a server certificate for 127.0.0.1, written under `dir` ([`write()`]), and the
/// configurations built from them as a user's files would be.
pub fn loopback_tls(dir: &Path) -> Result<LoopbackTls> {
    let certs = write(dir, &["127.0.0.1".to_string()])?;
    Ok(LoopbackTls {
        server: seqstream_replication::tls::server_config(&certs.cert, &certs.key, None)?,
        client: seqstream_replication::tls::client_config(&certs.ca, None)?,
    })
}

/// Creates `path` (it must not exist) readable by its owner only, as the daemons require of
/// key files, holding `bytes`.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?
        .write_all(bytes)?;
    Ok(())
}
