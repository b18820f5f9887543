//! A real etcd server for one test: Debian's `etcd` binary (package `etcd-server`, which
//! `.ci/run` installs), on free loopback ports (or on addresses the test names, in the
//! network namespace of the thread that starts it), with its data in a temporary directory,
//! killed when dropped. Tuned for tests: 10 ms heartbeats and a 100 ms election timeout, so etcd's
//! minimum lease TTL is 1 s.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_tcp_port, KillOnDrop};

/// A running etcd; see the module docs.
#[derive(Debug)]
pub struct Etcd {
    proc: Option<KillOnDrop>,
    ip: IpAddr,
    client_port: u16,
    /// Its command line, for [`restart`](Etcd::restart).
    args: Vec<String>,
    _data: tempfile::TempDir,
}

/// The etcd binary: `$ETCD_BIN`, else `etcd` on `PATH`.
fn binary() -> PathBuf {
    std::env::var_os("ETCD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| "etcd".into())
}

impl Etcd {
    /// Starts etcd and waits (at most 20 s) until it reports itself healthy.
    ///
    /// Panics when etcd cannot be started or does not become healthy: the test needs it
    /// (install `etcd-server`, or set `ETCD_BIN`).
    pub fn start() -> Etcd {
        Etcd::start_on(&[IpAddr::from([127, 0, 0, 1])])
    }

    /// Starts etcd listening for clients on each of `ips` (one port), its peer URL and
    /// [`endpoint`](Self::endpoint) on the first, in the network namespace of the calling
    /// thread (a thread that entered a namespace starts it there, and must be the one that
    /// reads through [`get`](Self::get)); waits as [`start`](Self::start) does.
    pub fn start_on(ips: &[IpAddr]) -> Etcd {
        let data = data_dir().expect("a temporary directory for etcd");
        let client_port = free_tcp_port();
        let peer_port = free_tcp_port();
        let ip = ips[0];
        let client = ips
            .iter()
            .map(|ip| format!("http://{ip}:{client_port}"))
            .collect::<Vec<_>>()
            .join(",");
        let peer = format!("http://{ip}:{peer_port}");
        let mut args: Vec<String> = vec!["--name".into(), "test".into(), "--data-dir".into()];
        args.push(data.path().display().to_string());
        for a in [
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &format!("http://{ip}:{client_port}"),
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
            "--initial-cluster",
            &format!("test={peer}"),
            "--heartbeat-interval",
            "10",
            "--election-timeout",
            "100",
            "--logger",
            "zap",
            "--log-level",
            "error",
        ] {
            args.push(a.to_string());
        }
        let mut etcd = Etcd {
            proc: None,
            ip,
            client_port,
            args,
            _data: data,
        };
        etcd.restart();
        etcd
    }

    /// Starts etcd again on its ports and data (every key and lease it held; etcd gives each
    /// lease its full TTL again when it comes back), killing it first if it runs, in the
    /// network namespace of the calling thread; waits until it reports itself healthy, as
    /// [`start`](Self::start) does.
    pub fn restart(&mut self) {
        self.proc = None;
        let mut cmd = Command::new(binary());
        cmd.args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let proc = KillOnDrop::spawn(&mut cmd).unwrap_or_else(|e| {
            panic!(
                "cannot start {} (install Debian's etcd-server, or set ETCD_BIN): {e}",
                binary().display()
            )
        });
        self.proc = Some(proc);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.healthy() {
            assert!(
                Instant::now() < deadline,
                "etcd did not become healthy in 20 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The client URL, `http://127.0.0.1:<port>` (the first address it listens on).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// Its client URL on `ip`, one of the addresses it listens on.
    pub fn endpoint_on(&self, ip: IpAddr) -> String {
        format!("http://{}", SocketAddr::new(ip, self.client_port))
    }

    /// The client address, for a proxy in front of it.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip, self.client_port)
    }

    /// `true` when `GET /health` answers `"health":"true"`.
    pub fn healthy(&self) -> bool {
        let Ok(mut s) = TcpStream::connect_timeout(&self.addr(), Duration::from_millis(200)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        if s.write_all(b"GET /health HTTP/1.0\r\n\r\n").is_err() {
            return false;
        }
        let mut body = String::new();
        let _ = s.read_to_string(&mut body);
        body.contains("\"health\":\"true\"")
    }

    /// The value of `key`, read with `etcdctl` (Debian's `etcd-client`, which `.ci/run`
    /// installs) as an operator would; `None` when the key does not exist.
    ///
    /// Panics when `etcdctl` cannot be run or fails.
    pub fn get(&self, key: &str) -> Option<String> {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint()))
            .args(["get", "--print-value-only", key])
            .output()
            .unwrap_or_else(|e| panic!("cannot run etcdctl (install Debian's etcd-client): {e}"));
        assert!(
            out.status.success(),
            "etcdctl get {key}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let value = String::from_utf8_lossy(&out.stdout).trim_end().to_string();
        (!value.is_empty()).then_some(value)
    }

    /// Kills etcd (SIGKILL) and reaps it: every client loses it at once.
    pub fn kill(&mut self) {
        self.proc = None;
    }
}

/// etcd's data directory: under `$ETCD_TMPDIR` when set, else on tmpfs (`/dev/shm`) when it
/// has room, else in the temporary directory. etcd syncs its log on every write, and a disk
/// busy with a build can hold one past a member's call limit (250 ms in the tests); a 1 GiB
/// floor covers several etcds' preallocated 64 MiB log segments. A benchmark that wants
/// etcd's real cost sets `ETCD_TMPDIR` to a directory on disk.
fn data_dir() -> std::io::Result<tempfile::TempDir> {
    if let Some(dir) = std::env::var_os("ETCD_TMPDIR") {
        return tempfile::tempdir_in(dir);
    }
    const SHM: &str = "/dev/shm";
    let path = std::ffi::CString::new(SHM).expect("no NUL in a literal path");
    // SAFETY: `path` is NUL-terminated and outlives the call; `stat` is a plain out-value
    // that statvfs fills in and that is read only when it returned 0.
    let free = unsafe {
        let mut stat: libc::statvfs = std::mem::zeroed();
        (libc::statvfs(path.as_ptr(), &mut stat) == 0)
            .then(|| stat.f_bavail as u64 * stat.f_frsize as u64)
    };
    if free.is_some_and(|b| b >= 1 << 30) {
        tempfile::tempdir_in(SHM)
    } else {
        tempfile::tempdir()
    }
}
