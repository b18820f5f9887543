//! TLS on replication links (rustls with its `ring` provider, TLS 1.2 and 1.3): the server's
//! and the client's configuration from PEM files, and `Transport`, the byte stream of one
//! connection, plain TCP or TLS over it, as a non-blocking `Read + Write`.
//!
//! TLS adds confidentiality and, through certificates, an authenticated channel for links that
//! leave a trusted network. The replication handshake (challenge and response under the
//! replication key) and its per-message session tags run inside it unchanged, so a link with
//! TLS is never weaker than one without. With TLS the sender's data is copied into rustls to
//! be encrypted (a message of at most 16 KiB is first gathered into one slice,
//! which spares rustls an allocation): the zero-copy write from the store mapping holds for
//! plain TCP only.
//!
//! Files: a certificate chain (PEM, leaf first), its private key (PEM, PKCS#8, PKCS#1 or
//! SEC1; refused when group or others may read it, as every key file is), and the CA
//! certificates (PEM) a peer's certificate must chain to. Mutual TLS: the server names the
//! CA its clients' certificates must chain to, and each client presents its own.

use std::io::{ErrorKind, IoSlice, Read, Write};
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::RootCertStore;
use socket2::SockRef;

use crate::{Error, Result};

/// Largest PEM file read (a certificate chain or a key).
const MAX_PEM: usize = 1 << 20;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn config_error(path: &Path, what: &str, e: impl std::fmt::Display) -> Error {
    Error::Config(format!("{}: {what}: {e}", path.display()))
}

/// The certificates in the PEM file `path` (at least one).
fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let bytes = std::fs::read(path).map_err(|e| config_error(path, "reading", e))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| config_error(path, "a certificate", e))?;
    if certs.is_empty() {
        return Err(config_error(path, "certificates", "none in the file"));
    }
    Ok(certs)
}

/// The private key in the PEM file `path`, which only its owner may read.
fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    let bytes = seqstream_auth::key::read_private(path, MAX_PEM)
        .map_err(|e| Error::Config(e.to_string()))?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| config_error(path, "a private key", e))
}

/// The trust anchors of the CA certificates in `path`.
fn roots(path: &Path) -> Result<Arc<RootCertStore>> {
    let mut roots = RootCertStore::empty();
    for c in certs(path)? {
        roots
            .add(c)
            .map_err(|e| config_error(path, "a CA certificate", e))?;
    }
    Ok(Arc::new(roots))
}

/// A server's TLS configuration: its certificate chain and key; with `client_ca`, mutual TLS
/// (every client must present a certificate chaining to it).
///
/// Errors: `Config`, naming the file, for a file that cannot be read or parsed, a key others
/// may read, or a certificate and key that do not match.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<rustls::ServerConfig>> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| config_error(cert, "TLS versions", e))?;
    let builder = match client_ca {
        Some(ca) => builder.with_client_cert_verifier(
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots(ca)?, provider())
                .build()
                .map_err(|e| config_error(ca, "the client CA", e))?,
        ),
        None => builder.with_no_client_auth(),
    };
    let config = builder
        .with_single_cert(certs(cert)?, private_key(key)?)
        .map_err(|e| config_error(cert, "the certificate and its key", e))?;
    Ok(Arc::new(config))
}

/// A client's TLS configuration: the CA the server's certificate must chain to; with
/// `identity` (certificate chain, key), the certificate it presents for mutual TLS.
///
/// Errors: as [`server_config`].
pub fn client_config(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<Arc<rustls::ClientConfig>> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| config_error(ca, "TLS versions", e))?
        .with_root_certificates(roots(ca)?);
    let config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(certs(cert)?, private_key(key)?)
            .map_err(|e| config_error(cert, "the certificate and its key", e))?,
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// The name a client checks the server's certificate against: `name` if given (a DNS name or
/// an IP address), else the upstream's IP address.
pub fn server_name(name: Option<&str>, upstream: IpAddr) -> Result<ServerName<'static>> {
    match name {
        Some(n) => ServerName::try_from(n.to_string())
            .map_err(|e| Error::Config(format!("TLS server name {n:?}: {e}"))),
        None => Ok(ServerName::IpAddress(upstream.into())),
    }
}

/// One connection's byte stream: the socket itself, or TLS over it, over a non-blocking
/// socket: a read or write that would block returns `WouldBlock`, and
/// [`flush`](Write::flush) pushes out what TLS holds (`WouldBlock` while the socket is full).
/// (Over a blocking socket a TLS read could block with plaintext in hand: it reads until the
/// socket comes back short.)
pub(crate) enum Transport<S> {
    /// Plain TCP.
    Plain(S),
    /// TLS: the rustls connection (client or server side) over the socket.
    Tls(Box<Tls<S>>),
}

/// Plaintext gathered into one slice before rustls takes it, at most: one TLS record's
/// (2¹⁴ bytes). rustls's `write_vectored` collects the slices of a call of more than one into
/// a `Vec` of its own, an allocation a call.
const GATHER_MAX: usize = 1 << 14;

/// A TLS connection: rustls's side of it, its socket, and the buffer that gathers a message's
/// parts (its header, its data, its tag) into one slice ([`GATHER_MAX`] bytes at most).
pub(crate) struct Tls<S> {
    conn: rustls::Connection,
    sock: S,
    gather: Vec<u8>,
}

impl<S> Transport<S> {
    /// A TLS connection over `socket`.
    pub(crate) fn tls(conn: impl Into<rustls::Connection>, socket: S) -> Self {
        Transport::Tls(Box::new(Tls {
            conn: conn.into(),
            sock: socket,
            gather: Vec::with_capacity(GATHER_MAX),
        }))
    }

    /// The socket.
    pub(crate) fn socket(&self) -> &S {
        match self {
            Transport::Plain(s) => s,
            Transport::Tls(t) => &t.sock,
        }
    }

    /// The socket, to register or configure.
    pub(crate) fn socket_mut(&mut self) -> &mut S {
        match self {
            Transport::Plain(s) => s,
            Transport::Tls(t) => &mut t.sock,
        }
    }

    /// The same stream over the socket converted by `f` (a mio socket into a std one).
    pub(crate) fn map<T>(self, f: impl FnOnce(S) -> T) -> Transport<T> {
        match self {
            Transport::Plain(s) => Transport::Plain(f(s)),
            Transport::Tls(t) => {
                let Tls { conn, sock, gather } = *t;
                Transport::Tls(Box::new(Tls {
                    conn,
                    sock: f(sock),
                    gather,
                }))
            }
        }
    }
}

/// The socket as rustls writes records to it: `send(2)`/`sendmsg(2)` with `MSG_NOSIGNAL`, as
/// the plain path writes (std's `write_vectored` is a `writev(2)`, which raises `SIGPIPE` on a
/// closed connection in a process that has not ignored it).
struct NoSignal<'a>(SockRef<'a>);

impl Write for NoSignal<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.send_with_flags(buf, libc::MSG_NOSIGNAL)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        self.0.send_vectored_with_flags(bufs, libc::MSG_NOSIGNAL)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writes what TLS holds to `sock` until it is all out (or the socket would block).
fn push<S: AsFd>(conn: &mut rustls::Connection, sock: &S) -> std::io::Result<()> {
    let mut out = NoSignal(SockRef::from(sock));
    while conn.wants_write() {
        conn.write_tls(&mut out)?;
    }
    Ok(())
}

/// The socket as rustls reads records from it, noting whether its last read came back short
/// (fewer bytes than rustls asked for: the socket held no more).
struct NotingShort<'a, S> {
    sock: &'a mut S,
    short: bool,
}

impl<S: Read> Read for NotingShort<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.sock.read(buf)?;
        self.short = n < buf.len();
        Ok(n)
    }
}

/// Plaintext into `buf`: what TLS holds, then what it decrypts of the records read from `sock`
/// (answering the handshake as it goes), until `buf` is full, a read of the socket comes back
/// short or would block, or the peer closed. So a read shorter than `buf` means the socket
/// held no more, as on a plain socket ([`Fill::Drained`](crate::framing::Fill::Drained)).
/// `WouldBlock` when there is no plaintext, `Ok(0)` once the peer closed and none is left.
fn read_tls<S: Read + AsFd>(
    conn: &mut rustls::Connection,
    sock: &mut S,
    buf: &mut [u8],
) -> std::io::Result<usize> {
    let mut filled = 0;
    loop {
        match conn.reader().read(&mut buf[filled..]) {
            Ok(0) => return Ok(filled),
            Ok(n) => {
                filled += n;
                if filled == buf.len() {
                    return Ok(filled);
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            // What was read first; the stream's end shows at the next read (as the end, or
            // as this error: the peer gone without a close_notify).
            Err(_) if filled > 0 => return Ok(filled),
            Err(e) => return Err(e),
        }
        // No plaintext left and room in `buf`: read the socket.
        let mut from = NotingShort { sock, short: false };
        let read = conn.read_tls(&mut from);
        let short = from.short;
        match read {
            Ok(0) => return Ok(filled),
            Ok(_) => {}
            Err(_) if filled > 0 => return Ok(filled),
            Err(e) => return Err(e),
        }
        if let Err(e) = conn.process_new_packets() {
            // A TLS error is the connection's for good: the next read returns it.
            return match filled {
                0 => Err(std::io::Error::new(ErrorKind::InvalidData, e)),
                _ => Ok(filled),
            };
        }
        // The handshake's answers go out at once; a full socket keeps them for `flush`. With
        // plaintext in hand, a failed write shows at the next `flush` instead.
        match push(conn, sock) {
            Err(e) if e.kind() != ErrorKind::WouldBlock && filled == 0 => return Err(e),
            _ => {}
        }
        if short {
            // What those records held, and no more for now.
            match conn.reader().read(&mut buf[filled..]) {
                Ok(n) => return Ok(filled + n),
                Err(_) if filled > 0 => return Ok(filled),
                Err(e) => return Err(e),
            }
        }
    }
}

impl<S: Read + AsFd> Read for Transport<S> {
    /// Plain: one `read` of the socket. TLS: [`read_tls`] (the TLS path is kept out of line,
    /// so the plain one inlines into the caller's duty cycle).
    #[inline]
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Transport::Plain(s) => s.read(buf),
            Transport::Tls(t) => read_tls(&mut t.conn, &mut t.sock, buf),
        }
    }

    /// Plain: one `readv`. TLS: [`read_tls`] into each buffer in turn, stopping at the first
    /// it does not fill, so that a short read means the same as on a plain socket.
    fn read_vectored(&mut self, bufs: &mut [std::io::IoSliceMut<'_>]) -> std::io::Result<usize> {
        let (conn, sock) = match self {
            Transport::Plain(s) => return s.read_vectored(bufs),
            Transport::Tls(t) => (&mut t.conn, &mut t.sock),
        };
        let mut total = 0;
        for buf in bufs.iter_mut().filter(|b| !b.is_empty()) {
            match read_tls(conn, sock, buf) {
                Ok(n) => {
                    total += n;
                    if n < buf.len() {
                        break;
                    }
                }
                Err(_) if total > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(total)
    }
}

impl<S: Read + Write + AsFd> Write for Transport<S> {
    /// Plain: one `send(2)`. TLS: takes what rustls's buffer has room for (`WouldBlock` when
    /// it has none) and pushes the records out as far as the socket takes them.
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Transport::Plain(s) => s.write(buf),
            Transport::Tls(_) => self.write_vectored(&[IoSlice::new(buf)]),
        }
    }

    /// Plain: one `sendmsg(2)` of every buffer (`MSG_NOSIGNAL`, as `write`'s `send(2)`), so
    /// a message's header, its data from the store mapping and its tag leave in one call,
    /// and in one TCP segment where they fit (the default `write_vectored` writes only the
    /// first buffer: one call and one segment per part). TLS: as `write`, every buffer into
    /// rustls at once, so they share records; buffers of [`GATHER_MAX`] bytes or fewer in
    /// all are gathered into one first, which rustls takes without an allocation.
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        let Tls { conn, sock, gather } = match self {
            Transport::Plain(s) => {
                return SockRef::from(&*s).send_vectored_with_flags(bufs, libc::MSG_NOSIGNAL)
            }
            Transport::Tls(t) => &mut **t,
        };
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        let n = if bufs.len() > 1 && len <= GATHER_MAX {
            gather.clear();
            for b in bufs {
                gather.extend_from_slice(b);
            }
            conn.writer().write(gather)?
        } else {
            conn.writer().write_vectored(bufs)?
        };
        let pushed = push(conn, sock);
        if n > 0 {
            // Taken: rustls holds what the socket did not, and sends it at the next push or
            // flush, where an error of this push shows again. Returning it here would have
            // the caller write the same bytes twice.
            return Ok(n);
        }
        match pushed {
            Err(e) if e.kind() != ErrorKind::WouldBlock => Err(e),
            _ if bufs.iter().any(|b| !b.is_empty()) => Err(ErrorKind::WouldBlock.into()),
            _ => Ok(0),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Transport::Plain(s) => s.flush(),
            Transport::Tls(t) => push(&mut t.conn, &t.sock),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{IoSliceMut, Read};
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

    use rustls::pki_types::ServerName;
    use socket2::{Domain, Socket, Type};

    use super::Transport;
    use crate::framing::Outbox;

    /// Both ends of a TLS connection over loopback TCP, the handshake done, the client's
    /// socket non-blocking (as a replication client's is).
    fn tls_pair() -> (Transport<TcpStream>, Transport<TcpStream>) {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let dir = tempfile::tempdir().unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["127.0.0.1".into()])
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
        let (ca_path, cert_path, key_path) = (
            dir.path().join("ca.crt"),
            dir.path().join("server.crt"),
            dir.path().join("server.key"),
        );
        std::fs::write(&ca_path, ca.pem()).unwrap();
        std::fs::write(&cert_path, cert.pem()).unwrap();
        seqstream_testkit::write_key(&key_path, key.serialize_pem().trim_end());
        let server_cfg = super::server_config(&cert_path, &key_path, None).unwrap();
        let client_cfg = super::client_config(&ca_path, None).unwrap();

        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client_sock = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut server_sock, _) = listener.accept().unwrap();
        for s in [&client_sock, &server_sock] {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        }
        let server = std::thread::spawn(move || {
            let mut conn =
                rustls::Connection::from(rustls::ServerConnection::new(server_cfg).unwrap());
            while conn.is_handshaking() {
                conn.complete_io(&mut server_sock).unwrap();
            }
            Transport::tls(conn, server_sock)
        });
        let name = ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
        let mut conn =
            rustls::Connection::from(rustls::ClientConnection::new(client_cfg, name).unwrap());
        while conn.is_handshaking() {
            conn.complete_io(&mut client_sock).unwrap();
        }
        client_sock.set_nonblocking(true).unwrap();
        (Transport::tls(conn, client_sock), server.join().unwrap())
    }

    /// Three messages sent as three TLS records (one write each), arrived before the read.
    fn three_records(server: &mut Transport<TcpStream>) {
        for byte in [1u8, 2, 3] {
            Outbox::default()
                .send(server, &[&[byte; 1000][..]])
                .unwrap();
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    /// A TLS read goes on decrypting records into the buffer until the socket has no more, so
    /// that a read shorter than the buffer means the socket held no more, as on a plain
    /// socket (`Fill::Drained`); it returned one record's plaintext before.
    #[test]
    fn a_tls_read_takes_every_record_that_has_arrived() {
        let (mut client, mut server) = tls_pair();
        three_records(&mut server);
        let mut got = vec![0u8; 64 << 10];
        assert_eq!(client.read(&mut got).unwrap(), 3000);
        assert!(got[..1000].iter().all(|&b| b == 1));
        assert!(got[2000..3000].iter().all(|&b| b == 3));
        let again = client.read(&mut got).unwrap_err();
        assert_eq!(again.kind(), std::io::ErrorKind::WouldBlock);

        // Vectored: each buffer filled in turn, the last one partly.
        three_records(&mut server);
        let (mut a, mut b, mut c) = ([0u8; 4], [0u8; 1500], vec![0u8; 64 << 10]);
        let n = client
            .read_vectored(&mut [
                IoSliceMut::new(&mut a),
                IoSliceMut::new(&mut b),
                IoSliceMut::new(&mut c),
            ])
            .unwrap();
        assert_eq!(n, 3000);
        assert_eq!(a, [1; 4]);
        assert!(b[..996].iter().all(|&x| x == 1) && b[996..].iter().all(|&x| x == 2));
        assert!(c[..496].iter().all(|&x| x == 2) && c[496..1496].iter().all(|&x| x == 3));
    }

    /// A message's parts (header, data from the store mapping, tag) leave in one call: over a
    /// `SOCK_SEQPACKET` pair each call is one record, so the first read returns all of them.
    /// The default `write_vectored` sent the first part alone: one call, and one TCP segment,
    /// per part.
    #[test]
    fn a_plain_transport_writes_a_messages_parts_in_one_call() {
        let (a, mut b) = Socket::pair(Domain::UNIX, Type::SEQPACKET, None).unwrap();
        let mut stream = Transport::Plain(a);
        Outbox::default()
            .send(&mut stream, &[b"header", b"data", b"tag"])
            .unwrap();
        let mut got = [0u8; 64];
        let n = b.read(&mut got).unwrap();
        assert_eq!(&got[..n], b"headerdatatag");
    }
}
