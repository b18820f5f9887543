//! The demo's child processes: started with their output in log files, stopped with SIGTERM
//! (then SIGKILL), and killed when the demo ends in any way — by `Drop` on an error or a
//! panic, and by the kernel (`PR_SET_PDEATHSIG`) if the demo itself is killed.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// One started process.
pub(crate) struct Proc {
    /// Short name, also the log file's.
    pub name: String,
    child: Child,
    /// Where its stderr goes.
    pub log: PathBuf,
    /// Where its stdout goes.
    pub out: PathBuf,
    exit: Option<ExitStatus>,
    /// Whether it may end by itself (a feed handler that has replayed its capture): a clean
    /// exit is then no early exit.
    may_finish: bool,
}

/// Every process the demo started, in start order.
pub(crate) struct Procs {
    logs: PathBuf,
    procs: Vec<Proc>,
    /// Set by SIGINT/SIGTERM: waits give up at once.
    interrupted: Arc<AtomicBool>,
}

impl Procs {
    /// A set whose logs go to `logs/`, whose waits end when `interrupted` is set.
    pub(crate) fn new(logs: &Path, interrupted: Arc<AtomicBool>) -> Result<Self> {
        std::fs::create_dir_all(logs)?;
        Ok(Procs {
            logs: logs.to_path_buf(),
            procs: Vec::new(),
            interrupted,
        })
    }

    /// Starts `program args…`, inside network namespace `netns` when given. A process of the
    /// same name that has exited (one that was killed) is replaced: the new one's output is
    /// appended to its logs.
    ///
    /// Errors: a process of that name still runs; the program cannot be started.
    pub(crate) fn spawn(
        &mut self,
        name: &str,
        netns: Option<&str>,
        program: &Path,
        args: &[String],
    ) -> Result<()> {
        if let Some(i) = self.procs.iter().position(|p| p.name == name) {
            if self.procs[i].exit.is_none() {
                bail!("{name} runs already");
            }
            self.procs.remove(i);
        }
        let log = self.logs.join(format!("{name}.log"));
        let out = self.logs.join(format!("{name}.out"));
        let append = |path: &Path| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| path.display().to_string())
        };
        let mut cmd = seqstream_apps::net::command_in(netns, program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(append(&out)?)
            .stderr(append(&log)?)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            );
        // SAFETY: `pre_exec` runs in the forked child before exec; prctl and setpgid are
        // async-signal-safe and touch no memory of the parent. PR_SET_PDEATHSIG survives the
        // exec (neither `ip` nor our binaries are set-uid), so the child dies if the demo
        // dies; its own process group keeps a terminal's Ctrl-C for the demo, which then
        // stops the children itself.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0
                    || libc::setpgid(0, 0) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name} ({})", program.display()))?;
        self.procs.push(Proc {
            name: name.to_string(),
            child,
            log,
            out,
            exit: None,
            may_finish: false,
        });
        Ok(())
    }

    /// Marks `name` as a process that ends by itself when its work is done: waits go on
    /// when it exits 0 (and still fail when it fails).
    pub(crate) fn may_finish(&mut self, name: &str) -> Result<()> {
        self.get(name)?.may_finish = true;
        Ok(())
    }

    /// The pid of process `name` (`ip netns exec` execs its program: the same pid).
    pub(crate) fn pid(&mut self, name: &str) -> Result<u32> {
        Ok(self.get(name)?.child.id())
    }

    fn get(&mut self, name: &str) -> Result<&mut Proc> {
        self.procs
            .iter_mut()
            .find(|p| p.name == name)
            .with_context(|| format!("no process {name}"))
    }

    /// Sends SIGKILL to `name` and reaps it: a crash on purpose, never reported as one.
    pub(crate) fn kill(&mut self, name: &str) -> Result<()> {
        let p = self.get(name)?;
        if p.exit.is_some() {
            bail!("{name} has exited already");
        }
        p.child.kill()?;
        p.exit = Some(p.child.wait()?);
        Ok(())
    }

    /// Whether `name` still runs (reaping it if it has exited).
    ///
    /// Errors: it has exited with a failure status.
    pub(crate) fn running(&mut self, name: &str) -> Result<bool> {
        let p = self.get(name)?;
        if p.exit.is_none() {
            p.exit = p.child.try_wait()?;
        }
        match p.exit {
            None => Ok(true),
            Some(s) if s.success() => Ok(false),
            Some(s) => bail!("{name} failed ({s}):\n{}", tail(&p.log)),
        }
    }

    /// Fails, naming it and showing its log, if a process that should still run has exited.
    pub(crate) fn check_running(&mut self) -> Result<()> {
        self.check_running_except(&[])
    }

    fn check_running_except(&mut self, except: &[&str]) -> Result<()> {
        for p in self
            .procs
            .iter_mut()
            .filter(|p| !except.contains(&p.name.as_str()))
        {
            if p.exit.is_none() {
                if let Some(status) = p.child.try_wait()? {
                    p.exit = Some(status);
                    if !(p.may_finish && status.success()) {
                        bail!("{} exited early ({status}):\n{}", p.name, tail(&p.log));
                    }
                }
            }
        }
        Ok(())
    }

    /// Waits up to `timeout` for `name` to exit by itself; fails if it does not, if it exits
    /// with an error, if another process dies meanwhile, or on SIGINT/SIGTERM.
    pub(crate) fn wait(&mut self, name: &str, timeout: Duration) -> Result<()> {
        self.wait_all(&[name], timeout)
    }

    /// Waits up to `timeout` for every process of `names` to exit by itself; fails if one
    /// does not, if one exits with an error, if another process dies meanwhile, or on
    /// SIGINT/SIGTERM.
    pub(crate) fn wait_all(&mut self, names: &[&str], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut running = 0;
            for name in names {
                let p = self.get(name)?;
                let exit = match p.exit {
                    Some(status) => Some(status),
                    None => p.child.try_wait()?,
                };
                match exit {
                    Some(status) => {
                        p.exit = Some(status);
                        if !status.success() {
                            bail!("{name} failed ({status}):\n{}", tail(&p.log));
                        }
                    }
                    None if Instant::now() > deadline => bail!(
                        "{name} did not finish within {timeout:?}:\n{}",
                        tail(&p.log)
                    ),
                    None => running += 1,
                }
            }
            if running == 0 {
                return Ok(());
            }
            self.check_running_except(names)?;
            if self.interrupted.load(Ordering::Relaxed) {
                bail!("interrupted while waiting for {}", names.join(" and "));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends SIGTERM to `name` and waits for it (SIGKILL after 10 s); fails unless it exits 0.
    pub(crate) fn stop(&mut self, name: &str) -> Result<()> {
        self.terminate(name, false)
    }

    /// [`stop`](Self::stop) for a program that is not ours and may end by the SIGTERM itself
    /// (etcd): that counts as a clean stop too.
    pub(crate) fn stop_foreign(&mut self, name: &str) -> Result<()> {
        self.terminate(name, true)
    }

    fn terminate(&mut self, name: &str, sigterm_ok: bool) -> Result<()> {
        use std::os::unix::process::ExitStatusExt;
        let p = self.get(name)?;
        if p.exit.is_none() {
            // SAFETY: kill(2) on the pid of our own child, which `wait` has not reaped yet
            // (exit is None), so the pid cannot have been reused.
            unsafe {
                libc::kill(p.child.id() as libc::pid_t, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while p.exit.is_none() {
            if let Some(status) = p.child.try_wait()? {
                p.exit = Some(status);
            } else if Instant::now() > deadline {
                let _ = p.child.kill();
                p.exit = Some(p.child.wait()?);
                bail!("{name} ignored SIGTERM for 10 s:\n{}", tail(&p.log));
            } else {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        match p.exit {
            Some(s) if s.success() => Ok(()),
            Some(s) if sigterm_ok && s.signal() == Some(libc::SIGTERM) => Ok(()),
            Some(s) => bail!("{name} exited with {s}:\n{}", tail(&p.log)),
            None => unreachable!("set above"),
        }
    }

    /// The stdout of `name`.
    pub(crate) fn output(&mut self, name: &str) -> Result<String> {
        let p = self.get(name)?;
        std::fs::read_to_string(&p.out).with_context(|| p.out.display().to_string())
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for p in self.procs.iter_mut().rev() {
            if p.exit.is_none() {
                let _ = p.child.kill();
                let _ = p.child.wait();
            }
        }
    }
}

/// The last lines of a log file (without a backtrace), indented, for error messages.
pub(crate) fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let text = text.split("\nStack backtrace:").next().unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(15);
    lines[from..].iter().map(|l| format!("    {l}\n")).collect()
}
