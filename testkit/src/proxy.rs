//! A TCP proxy on loopback whose link a test can cut: what "the leader is cut off from etcd"
//! needs without network namespaces. Each accepted connection is joined to a new connection
//! to the target by two copying threads. [`TcpProxy::cut`] shuts every current connection
//! down and refuses new ones (accepted, then closed) until [`TcpProxy::heal`].

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Default)]
struct State {
    cut: AtomicBool,
    stop: AtomicBool,
    open: Mutex<Vec<TcpStream>>,
}

/// A cuttable TCP proxy; see the module docs. Stops its threads when dropped.
#[derive(Debug)]
pub struct TcpProxy {
    addr: SocketAddr,
    state: Arc<State>,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

impl TcpProxy {
    /// A proxy on `127.0.0.1:<free port>` to `target`.
    pub fn start(target: SocketAddr) -> TcpProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the proxy");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let addr = listener.local_addr().expect("the proxy's address");
        let state = Arc::new(State::default());
        let s = state.clone();
        let acceptor = std::thread::spawn(move || {
            while !s.stop.load(Ordering::Relaxed) {
                let Ok((inbound, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                };
                if s.cut.load(Ordering::Relaxed) {
                    continue; // dropped: the client sees the connection close
                }
                let _ = inbound.set_nonblocking(false);
                let Ok(outbound) = TcpStream::connect(target) else {
                    continue;
                };
                let _ = inbound.set_nodelay(true);
                let _ = outbound.set_nodelay(true);
                if let (Ok(a), Ok(b)) = (inbound.try_clone(), outbound.try_clone()) {
                    let mut open = s.open.lock().expect("proxy lock");
                    open.push(a);
                    open.push(b);
                }
                pipe(inbound.try_clone(), outbound.try_clone());
                pipe(outbound.try_clone(), inbound.try_clone());
            }
        });
        TcpProxy {
            addr,
            state,
            acceptor: Some(acceptor),
        }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy as a URL, `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Cuts the link: every open connection is shut down, new ones are closed at once.
    pub fn cut(&self) {
        self.state.cut.store(true, Ordering::Relaxed);
        for s in self.state.open.lock().expect("proxy lock").drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Lets new connections through again.
    pub fn heal(&self) {
        self.state.cut.store(false, Ordering::Relaxed);
    }
}

/// Copies `from` to `to` on a thread of its own until either side closes.
fn pipe(from: std::io::Result<TcpStream>, to: std::io::Result<TcpStream>) {
    let (Ok(mut from), Ok(mut to)) = (from, to) else {
        return;
    };
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 << 10];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        self.cut();
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
    }
}
