//! CPU time and peak memory of processes on this machine, read from /proc: the broker, the
//! PostgreSQL server (postmaster and its backends) and queen-bench itself, so a run can say which
//! of them used the cores.

use std::io;
use std::time::Instant;

use serde::Serialize;

/// CPU time of one process, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatTimes {
    pub ppid: i32,
    /// utime + stime: the process itself.
    pub own: u64,
    /// cutime + cstime: its children that exited and were waited for.
    pub reaped_children: u64,
}

/// The fields of `/proc/<pid>/stat` we read. The command name (field 2) may hold spaces and
/// parentheses, so fields are counted from the last `)`.
pub fn parse_stat(stat: &str) -> Option<StatTimes> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // After the name: state (3), ppid (4), ... utime (14), stime (15), cutime (16), cstime (17).
    let field = |n: usize| fields.get(n - 3)?.parse::<i64>().ok();
    let ticks = |n: usize| field(n).map(|v| v.max(0) as u64);
    Some(StatTimes {
        ppid: i32::try_from(field(4)?).ok()?,
        own: ticks(14)? + ticks(15)?,
        reaped_children: ticks(16)? + ticks(17)?,
    })
}

/// `VmHWM` (peak resident set) of `/proc/<pid>/status`, in bytes.
pub fn parse_peak_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn read_stat(pid: i32) -> io::Result<StatTimes> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat(&text).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("unreadable /proc/{pid}/stat")))
}

/// Peak resident set size of a live process, in bytes.
pub fn peak_rss(pid: i32) -> io::Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    parse_peak_rss(&text)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("no VmHWM in /proc/{pid}/status")))
}

/// Clock ticks per second (`getconf CLK_TCK`).
fn ticks_per_second() -> f64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(ticks)) if ticks > 0 => ticks as f64,
        // Linux has reported 100 on every architecture for decades.
        _ => 100.0,
    }
}

/// CPU ticks of a process plus everything its children used, live or reaped. Children that
/// exit without being waited for between two readings are missed; PostgreSQL waits for its
/// backends, and the broker's connections live as long as the broker.
fn tree_ticks(root: i32) -> io::Result<u64> {
    let root_times = read_stat(root)?;
    let mut total = root_times.own + root_times.reaped_children;
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<i32>().ok()) else { continue };
        // A process may exit between listing and reading: it is simply not counted.
        if let Ok(times) = read_stat(pid)
            && times.ppid == root
        {
            total += times.own;
        }
    }
    Ok(total)
}

/// Ticks of the whole machine, all cores together, from the first line of `/proc/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MachineTicks {
    /// user + nice + system + irq + softirq: time some process or the kernel used.
    pub busy: u64,
    /// Time the hypervisor gave our virtual cores to someone else.
    pub steal: u64,
}

pub fn parse_machine_ticks(stat: &str) -> Option<MachineTicks> {
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let fields: Vec<u64> = line.split_whitespace().map(|f| f.parse().ok()).collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal ...
    let field = |n: usize| fields.get(n).copied();
    Some(MachineTicks { busy: field(0)? + field(1)? + field(2)? + field(5)? + field(6)?, steal: field(7).unwrap_or(0) })
}

fn read_machine_ticks() -> Option<MachineTicks> {
    parse_machine_ticks(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// The processes a run watches.
#[derive(Debug, Clone, Copy, Default)]
pub struct Watched {
    pub broker: Option<i32>,
    /// The PostgreSQL postmaster; its backends are counted with it.
    pub postgres: Option<i32>,
}

/// CPU used so far, in ticks, by each watched process.
#[derive(Debug, Clone, Copy)]
pub struct CpuReading {
    at: Instant,
    broker: Option<u64>,
    postgres: Option<u64>,
    bench: Option<u64>,
    machine: Option<MachineTicks>,
}

/// CPU seconds used between two readings, and the wall time between them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CpuUsage {
    pub wall_s: f64,
    pub broker_s: Option<f64>,
    pub postgres_s: Option<f64>,
    pub bench_s: Option<f64>,
    /// Everything else that ran on the machine meanwhile (other processes, the kernel): a run
    /// where this is large shared the cores with someone.
    pub other_s: Option<f64>,
    /// CPU time the hypervisor took away from this machine.
    pub steal_s: Option<f64>,
}

impl Watched {
    /// Reads every watched process; one that cannot be read (gone, or on another machine) is
    /// left out of the usage rather than failing the run.
    pub fn read_cpu(&self) -> CpuReading {
        CpuReading {
            at: Instant::now(),
            broker: self.broker.and_then(|pid| read_stat(pid).ok()).map(|t| t.own),
            postgres: self.postgres.and_then(|pid| tree_ticks(pid).ok()),
            bench: read_stat(std::process::id() as i32).ok().map(|t| t.own),
            machine: read_machine_ticks(),
        }
    }

    pub fn peak_broker_rss(&self) -> Option<u64> {
        self.broker.and_then(|pid| peak_rss(pid).ok())
    }
}

impl CpuReading {
    pub fn usage_since(&self, start: &CpuReading) -> CpuUsage {
        let ticks = ticks_per_second();
        let seconds = |end: Option<u64>, begin: Option<u64>| Some(end?.saturating_sub(begin?) as f64 / ticks);
        let (broker_s, postgres_s, bench_s) = (
            seconds(self.broker, start.broker),
            seconds(self.postgres, start.postgres),
            seconds(self.bench, start.bench),
        );
        let busy_s = seconds(self.machine.map(|m| m.busy), start.machine.map(|m| m.busy));
        let watched_s = broker_s.unwrap_or(0.0) + postgres_s.unwrap_or(0.0) + bench_s.unwrap_or(0.0);
        CpuUsage {
            wall_s: self.at.duration_since(start.at).as_secs_f64(),
            broker_s,
            postgres_s,
            bench_s,
            // Process times and machine times are sampled a moment apart: clamp the noise.
            other_s: busy_s.map(|busy| (busy - watched_s).max(0.0)),
            steal_s: seconds(self.machine.map(|m| m.steal), start.machine.map(|m| m.steal)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        let stat = "4242 (tokio (rt) worker) S 17 4242 4242 0 -1 4194560 1234 0 0 0 150 25 7 3 20 0 9 0 \
                    1000 123456789 2048 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(parse_stat(stat), Some(StatTimes { ppid: 17, own: 175, reaped_children: 10 }));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S 0 1"), None);
    }

    #[test]
    fn peak_rss_is_vm_hwm_in_bytes() {
        let status = "Name:\tqueen\nVmPeak:\t  900000 kB\nVmHWM:\t   31232 kB\nVmRSS:\t   30000 kB\n";
        assert_eq!(parse_peak_rss(status), Some(31232 * 1024));
        assert_eq!(parse_peak_rss("Name:\tqueen\n"), None);
    }

    #[test]
    fn machine_ticks_add_up_the_busy_columns() {
        let stat = "cpu  100 5 50 9000 40 3 2 7 0 0\ncpu0 50 2 25 4500 20 1 1 3 0 0\n";
        assert_eq!(parse_machine_ticks(stat), Some(MachineTicks { busy: 160, steal: 7 }));
        assert_eq!(parse_machine_ticks("intr 1 2 3\n"), None);
    }

    #[test]
    fn this_process_can_be_read() {
        let watched = Watched { broker: Some(std::process::id() as i32), postgres: None };
        let start = watched.read_cpu();
        let usage = watched.read_cpu().usage_since(&start);
        assert!(usage.broker_s.is_some() && usage.bench_s.is_some() && usage.postgres_s.is_none());
        assert!(usage.other_s.is_some() && usage.steal_s.is_some());
        assert!(watched.peak_broker_rss().unwrap() > 0);
    }
}
