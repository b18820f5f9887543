//! A lossy UDP link for tests: a relay between a sender's side and one destination that
//! drops, duplicates and reorders datagrams in both directions (NAKs included), on a thread of
//! its own, stopped and joined when dropped. Deterministic for a seed, up to thread timing.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Fractions of datagrams the relay mistreats, each way: 10 % dropped, 5 % sent twice, 5 %
/// held back and sent after the next one.
pub const DROPPED: f64 = 0.10;

/// The relay: datagrams sent to [`addr`](Self::addr) go to its destination from another
/// socket, and what comes back to that socket goes to the last sender, each mistreated as
/// [`DROPPED`] says.
#[derive(Debug)]
pub struct LossyRelay {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl LossyRelay {
    /// A relay on 127.0.0.1 to `to`, its losses drawn from `seed`.
    pub fn start(to: SocketAddr, seed: u64) -> LossyRelay {
        LossyRelay::start_on(IpAddr::from([127, 0, 0, 1]), to, seed)
    }

    /// A relay whose two sockets are bound to `ip` (the destination sees its datagrams come
    /// from `ip`), in the network namespace of the calling thread.
    pub fn start_on(ip: IpAddr, to: SocketAddr, seed: u64) -> LossyRelay {
        let front = UdpSocket::bind((ip, 0)).expect("binding the relay's front");
        let back = UdpSocket::bind((ip, 0)).expect("binding the relay's back");
        front.set_nonblocking(true).expect("non-blocking");
        back.set_nonblocking(true).expect("non-blocking");
        let addr = front.local_addr().expect("bound");
        let stop = Arc::new(AtomicBool::new(false));
        let running = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut peer: Option<SocketAddr> = None;
            let mut held: [Option<Vec<u8>>; 2] = [None, None];
            let mut buf = vec![0u8; 65_536];
            while !running.load(Ordering::Relaxed) {
                let mut work = 0;
                for (dir, held) in held.iter_mut().enumerate() {
                    let (rx, tx) = if dir == 0 {
                        (&front, &back)
                    } else {
                        (&back, &front)
                    };
                    for _ in 0..64 {
                        let Ok((n, from)) = rx.recv_from(&mut buf) else {
                            break;
                        };
                        work += 1;
                        let dest = if dir == 0 {
                            peer = Some(from);
                            to
                        } else {
                            match peer {
                                Some(p) => p,
                                None => continue,
                            }
                        };
                        let d = buf[..n].to_vec();
                        let roll: f64 = rng.random();
                        if roll < DROPPED {
                            continue;
                        }
                        let copies = if roll < DROPPED + 0.05 { 2 } else { 1 };
                        if roll > 0.95 && held.is_none() {
                            *held = Some(d); // sent after the next one: reordered
                            continue;
                        }
                        for _ in 0..copies {
                            let _ = tx.send_to(&d, dest);
                        }
                        if let Some(h) = held.take() {
                            let _ = tx.send_to(&h, dest);
                        }
                    }
                }
                if work == 0 {
                    std::thread::sleep(std::time::Duration::from_micros(100));
                }
            }
        });
        LossyRelay {
            addr,
            stop,
            thread: Some(thread),
        }
    }

    /// Where senders send.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for LossyRelay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
