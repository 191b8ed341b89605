//! The report of a run: the targets as ratios, every scenario's figures and verdict, the
//! ceiling, as JSON and as markdown.

use std::fmt::Write;
use std::path::Path;

use serde::Serialize;

use crate::ceiling::CeilingReport;
use crate::environment::{Environment, fdatasync_ops};
use crate::scenarios::{ScenarioName, ScenarioReport};
use crate::stats::Distribution;

/// The push scenarios' batch size that the ceiling comparison is about.
const CEILING_BATCH: usize = 100;
const CEILING_MIN_RATIO: f64 = 0.5;
const FANOUT_MIN_RATIO: f64 = 0.8;
const LATENCY_P50_MAX_MS: f64 = 10.0;
const PEAK_RSS_MAX_MIB: f64 = 48.0;
/// D4: a run whose fdatasync rate moved more than this factor measured two different disks.
const FDATASYNC_MAX_DRIFT: f64 = 2.0;

/// Cores of other processes (and stolen by the hypervisor) above which a scenario is flagged as
/// having shared the machine.
const OTHER_LOAD_WARNING_CORES: f64 = 0.25;

const MIB: f64 = 1024.0 * 1024.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Verdict {
    Pass,
    Miss,
    NotMeasured,
}

impl Verdict {
    fn label(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Miss => "MISS",
            Verdict::NotMeasured => "not measured",
        }
    }
}

/// One target, checked.
#[derive(Debug, Clone, Serialize)]
pub struct TargetCheck {
    pub target: String,
    /// The figures the verdict comes from.
    pub measured: String,
    /// The ratio or value compared with the threshold.
    pub value: Option<f64>,
    pub verdict: Verdict,
    /// By how much it was missed, when it was.
    pub shortfall: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub environment: Environment,
    pub scenarios: Vec<ScenarioReport>,
    pub ceiling: Option<CeilingReport>,
    pub targets: Vec<TargetCheck>,
    /// Every scenario delivered every message to every group exactly once.
    pub verified: bool,
    /// What failed outside the scenarios (the ceiling, the suite's own set-up).
    pub failures: Vec<String>,
}

impl Report {
    pub fn new(environment: Environment, scenarios: Vec<ScenarioReport>, ceiling: Option<CeilingReport>) -> Self {
        let targets = check_targets(&scenarios, ceiling.as_ref());
        let verified = scenarios.iter().all(ScenarioReport::passed);
        Self { environment, scenarios, ceiling, targets, verified, failures: Vec::new() }
    }

    /// Every problem that makes the run fail, one line each.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = self.failures.clone();
        for scenario in &self.scenarios {
            if let Some(failure) = &scenario.failure {
                problems.push(format!("{}: {failure}", scenario.scenario));
            }
            for verification in &scenario.verification {
                problems.extend(verification.problems().into_iter().map(|p| format!("{}: {p}", scenario.scenario)));
            }
        }
        problems
    }

    /// Writes `report.json` and `report.md` into `dir`.
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let json = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(dir.join("report.json"), json)?;
        std::fs::write(dir.join("report.md"), self.markdown())
    }

    pub fn markdown(&self) -> String {
        let mut out = String::new();
        self.write_header(&mut out);
        self.write_targets(&mut out);
        self.write_scenarios(&mut out);
        self.write_fairness_and_plans(&mut out);
        if let Some(ceiling) = &self.ceiling {
            write_ceiling(&mut out, ceiling);
        }
        self.write_problems(&mut out);
        out
    }

    fn write_header(&self, out: &mut String) {
        let env = &self.environment;
        let or_unknown = |v: &Option<String>| v.clone().unwrap_or_else(|| "unknown".into());
        let _ = writeln!(out, "## Queen benchmark, {}\n", env.date);
        let _ = writeln!(
            out,
            "- machine: {} cores ({}); broker: {} at commit {}",
            env.nproc,
            or_unknown(&env.cpu_model),
            env.broker,
            or_unknown(&env.broker_commit)
        );
        let _ = writeln!(
            out,
            "- PostgreSQL {}, synchronous_commit={}, fsync={}",
            or_unknown(&env.postgres_version),
            or_unknown(&env.synchronous_commit),
            or_unknown(&env.fsync)
        );
        if env.fdatasync_before.is_some() || env.fdatasync_after.is_some() {
            let _ = writeln!(
                out,
                "- pg_test_fsync before: `{}`; after: `{}`",
                or_unknown(&env.fdatasync_before),
                or_unknown(&env.fdatasync_after)
            );
            let rates = env
                .fdatasync_before
                .as_deref()
                .and_then(fdatasync_ops)
                .zip(env.fdatasync_after.as_deref().and_then(fdatasync_ops));
            if let Some((before, after)) = rates
                && before.max(after) > FDATASYNC_MAX_DRIFT * before.min(after)
            {
                let _ = writeln!(
                    out,
                    "- **WARNING: the disk's fdatasync rate moved more than {FDATASYNC_MAX_DRIFT}× during the run; \
                     its ratios compare two different disks**"
                );
            }
        }
        let shared: Vec<String> = self
            .scenarios
            .iter()
            .filter_map(|s| {
                let cpu = s.measured?.cpu;
                let cores = (cpu.other_s? + cpu.steal_s.unwrap_or(0.0)) / cpu.wall_s.max(1e-9);
                (cores > OTHER_LOAD_WARNING_CORES).then(|| format!("{} ({cores:.2})", s.scenario))
            })
            .collect();
        if !shared.is_empty() {
            let _ = writeln!(
                out,
                "- **WARNING: other processes or the hypervisor took more than {OTHER_LOAD_WARNING_CORES} cores during: \
                 {}**",
                shared.join(", ")
            );
        }
        let _ = writeln!(out, "- load: `{}`", env.load);
        if !self.scenarios.is_empty() {
            let verdict = if self.verified {
                "every message pushed was delivered to every group exactly once"
            } else {
                "**VERIFICATION FAILED** (see Problems)"
            };
            let _ = writeln!(out, "- delivery: {verdict}");
        }
        out.push('\n');
    }

    fn write_targets(&self, out: &mut String) {
        let _ = writeln!(out, "| target | measured | verdict |\n|---|---|---|");
        for target in &self.targets {
            let verdict = match &target.shortfall {
                Some(shortfall) => format!("**{}** by {shortfall}", target.verdict.label()),
                None => format!("**{}**", target.verdict.label()),
            };
            let _ = writeln!(out, "| {} | {} | {verdict} |", target.target, target.measured);
        }
        out.push('\n');
    }

    fn write_scenarios(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "| scenario | pushed msg/s | delivered msg/s | e2e ms p50 / p90 / p99 / max | broker CPU s per M msgs | \
             cores used: broker / PostgreSQL / queen-bench / other (stolen) | broker peak RSS MiB | errors | verified |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---|");
        for s in &self.scenarios {
            let cores = s.measured.map_or_else(dash, |m| {
                let share = |cpu: Option<f64>| cpu.map_or_else(dash, |c| format!("{:.2}", c / m.cpu.wall_s.max(1e-9)));
                format!(
                    "{} / {} / {} / {} ({})",
                    share(m.cpu.broker_s),
                    share(m.cpu.postgres_s),
                    share(m.cpu.bench_s),
                    share(m.cpu.other_s),
                    share(m.cpu.steal_s)
                )
            });
            let verified = if s.passed() { "yes" } else { "**NO**" };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {verified} |",
                s.scenario,
                s.pushed_per_s.map_or_else(dash, thousands),
                s.delivered_per_s.map_or_else(dash, thousands),
                s.latency_ms.as_ref().map_or_else(dash, |d| percentiles(d, 1)),
                s.broker_cpu_s_per_million.map_or_else(dash, |c| format!("{c:.1}")),
                cores,
                s.peak_broker_rss_bytes.map_or_else(dash, |b| format!("{:.1}", b as f64 / MIB)),
                s.errors.total(),
            );
        }
        out.push('\n');
        for s in &self.scenarios {
            let _ = writeln!(out, "- `{}`: {}", s.scenario, s.shape);
        }
        out.push('\n');
    }

    fn write_fairness_and_plans(&self, out: &mut String) {
        for s in &self.scenarios {
            if let Some(fairness) = &s.fairness {
                let _ = writeln!(
                    out,
                    "Fairness ({}): {} of {} partitions served in {} pops (batch 10, one partition per pop); pops \
                     before a partition's first service p50 / p90 / p99 / max: {}{}.\n",
                    s.scenario,
                    fairness.partitions_served,
                    fairness.partitions,
                    fairness.pops,
                    fairness.pops_before_first_served.as_ref().map_or_else(dash, |d| percentiles(d, 0)),
                    fairness.pops_before_first_served.as_ref().map_or_else(String::new, |d| format!(
                        " (max = {:.2} × the partition count; 1.0 means none was served twice before all were \
                         served once)",
                        d.max / fairness.partitions as f64
                    )),
                );
            }
            if let Some(plans) = &s.candidate_plans {
                let total = (plans.full + plans.candidates + plans.skipped).max(1);
                let _ = writeln!(
                    out,
                    "Queue-wide pop plans ({}, pushes to 3 of the partitions): {} full scans, {} from the candidate \
                     list, {} skipped ({:.1} % without a full scan).\n",
                    s.scenario,
                    plans.full,
                    plans.candidates,
                    plans.skipped,
                    100.0 * (plans.candidates + plans.skipped) as f64 / total as f64
                );
            }
        }
    }

    fn write_problems(&self, out: &mut String) {
        let problems = self.problems();
        let errors: Vec<String> = self
            .scenarios
            .iter()
            .flat_map(|s| s.errors.first.iter().map(move |e| format!("{}: {e}", s.scenario)))
            .collect();
        if problems.is_empty() && errors.is_empty() {
            return;
        }
        let _ = writeln!(out, "### Problems\n");
        for line in problems.iter().chain(&errors) {
            let _ = writeln!(out, "- {line}");
        }
        out.push('\n');
    }
}

fn write_ceiling(out: &mut String, ceiling: &CeilingReport) {
    let _ = writeln!(
        out,
        "Storage ceiling (`append_in_transaction`, no broker; {:.0} s per cell):\n",
        ceiling.cell_seconds
    );
    let _ = writeln!(
        out,
        "| msgs/segment | segments/tx | connections | segments/s | msgs/s | tx ms p50 / p90 / p99 / max |"
    );
    let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|");
    for cell in &ceiling.cells {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            cell.shape.messages_per_segment,
            cell.shape.segments_per_transaction,
            cell.shape.connections,
            thousands(cell.segments_per_s),
            thousands(cell.messages_per_s),
            cell.transaction_ms.as_ref().map_or_else(dash, |d| percentiles(d, 1)),
        );
    }
    out.push('\n');
}

fn dash() -> String {
    "–".into()
}

fn percentiles(d: &Distribution, decimals: usize) -> String {
    format!("{:.decimals$} / {:.decimals$} / {:.decimals$} / {:.decimals$}", d.p50, d.p90, d.p99, d.max)
}

/// `12345.6` as `12,346`.
fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn scenario(scenarios: &[ScenarioReport], name: ScenarioName) -> Option<&ScenarioReport> {
    scenarios.iter().find(|s| s.scenario == name && s.failure.is_none())
}

/// A target the value must reach.
fn at_least(target: String, measured: String, value: Option<f64>, threshold: f64) -> TargetCheck {
    let (verdict, shortfall) = match value {
        None => (Verdict::NotMeasured, None),
        Some(v) if v >= threshold => (Verdict::Pass, None),
        Some(v) => {
            (Verdict::Miss, Some(format!("{:.0} % ({v:.2} < {threshold})", 100.0 * (threshold - v) / threshold)))
        }
    };
    TargetCheck { target, measured, value, verdict, shortfall }
}

/// A target the value must stay under.
fn below(target: String, measured: String, value: Option<f64>, bound: f64, unit: &str) -> TargetCheck {
    let (verdict, shortfall) = match value {
        None => (Verdict::NotMeasured, None),
        Some(v) if v < bound => (Verdict::Pass, None),
        Some(v) => {
            (Verdict::Miss, Some(format!("{:.1} {unit} ({:.0} % over)", v - bound, 100.0 * (v - bound) / bound)))
        }
    };
    TargetCheck { target, measured, value, verdict, shortfall }
}

fn check_targets(scenarios: &[ScenarioReport], ceiling: Option<&CeilingReport>) -> Vec<TargetCheck> {
    let not_run = || "not run".to_owned();

    let push = scenario(scenarios, ScenarioName::PushB100).and_then(|s| s.pushed_per_s);
    let cell = ceiling.and_then(|c| c.same_shape_as_push(CEILING_BATCH));
    let best = ceiling.and_then(CeilingReport::best);
    let ratio = push.zip(cell).map(|(p, c)| p / c.messages_per_s);
    let measured = match (push, cell) {
        (Some(push), Some(cell)) => {
            let mut text = format!(
                "push-b100 {} msg/s ÷ ceiling {} msg/s ({}) = **{:.2}**",
                thousands(push),
                thousands(cell.messages_per_s),
                cell.shape,
                push / cell.messages_per_s
            );
            if let Some(best) = best {
                let _ = write!(
                    text,
                    "; best cell {} msg/s ({}): {:.2}",
                    thousands(best.messages_per_s),
                    best.shape,
                    push / best.messages_per_s
                );
            }
            text
        }
        _ => not_run(),
    };
    let ceiling_target = at_least(
        format!("push at batch 100 ≥ {CEILING_MIN_RATIO} × storage ceiling"),
        measured,
        ratio,
        CEILING_MIN_RATIO,
    );

    let baseline = scenario(scenarios, ScenarioName::Fanout0).and_then(|s| s.pushed_per_s);
    let fanned = scenario(scenarios, ScenarioName::Fanout10).and_then(|s| s.pushed_per_s);
    let ratio = fanned.zip(baseline).map(|(f, b)| f / b);
    let measured = match (fanned, baseline, ratio) {
        (Some(f), Some(b), Some(r)) => {
            format!("fanout-10 {} msg/s ÷ fanout-0 {} msg/s = **{r:.2}** (C++ Queen: 0.46)", thousands(f), thousands(b))
        }
        _ => not_run(),
    };
    let fanout_target = at_least(
        format!("push rate with 10 groups ≥ {FANOUT_MIN_RATIO} × with none"),
        measured,
        ratio,
        FANOUT_MIN_RATIO,
    );

    let p50 = scenario(scenarios, ScenarioName::E2eLatency).and_then(|s| s.latency_ms).map(|d| d.p50);
    let latency_target = below(
        format!("e2e p50 at light load < {LATENCY_P50_MAX_MS} ms"),
        p50.map_or_else(not_run, |p| format!("p50 **{p:.2} ms**")),
        p50,
        LATENCY_P50_MAX_MS,
        "ms",
    );

    let push_rss: Vec<(ScenarioName, u64)> = scenarios
        .iter()
        .filter(|s| s.scenario.is_push())
        .filter_map(|s| Some((s.scenario, s.peak_broker_rss_bytes?)))
        .collect();
    let peak = push_rss.iter().max_by_key(|(_, b)| *b);
    let rss_target = below(
        format!("broker peak RSS < {PEAK_RSS_MAX_MIB} MiB through the push scenarios"),
        peak.map_or_else(not_run, |(name, bytes)| format!("**{:.1} MiB** (in {name})", *bytes as f64 / MIB)),
        peak.map(|(_, bytes)| *bytes as f64 / MIB),
        PEAK_RSS_MAX_MIB,
        "MiB",
    );

    vec![ceiling_target, fanout_target, latency_target, rss_target]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ceiling::{CeilingCell, CellShape};
    use crate::procfs::CpuUsage;
    use crate::workload::{ErrorCounts, Measured};

    fn scenario_report(name: ScenarioName, pushed_per_s: f64, rss_mib: u64) -> ScenarioReport {
        let measured = Measured {
            pushed: (pushed_per_s * 10.0) as u64,
            delivered: 0,
            cpu: CpuUsage {
                wall_s: 10.0,
                broker_s: Some(5.0),
                postgres_s: Some(8.0),
                bench_s: None,
                other_s: Some(1.0),
                steal_s: Some(0.5),
            },
        };
        ScenarioReport {
            scenario: name,
            shape: "a shape".into(),
            measured: Some(measured),
            pushed_per_s: Some(pushed_per_s),
            delivered_per_s: Some(0.0),
            latency_ms: None,
            broker_cpu_s_per_million: Some(12.5),
            peak_broker_rss_bytes: Some(rss_mib * 1024 * 1024),
            fairness: None,
            candidate_plans: None,
            verification: vec![],
            errors: ErrorCounts::default(),
            failure: None,
        }
    }

    fn cell(messages_per_segment: usize, segments_per_transaction: usize, messages_per_s: f64) -> CeilingCell {
        CeilingCell {
            shape: CellShape { messages_per_segment, segments_per_transaction, connections: 4 },
            seconds: 3.0,
            segments_per_s: messages_per_s / messages_per_segment as f64,
            messages_per_s,
            transaction_ms: None,
        }
    }

    #[test]
    fn targets_are_ratios_with_their_shortfall() {
        let mut latency = scenario_report(ScenarioName::E2eLatency, 50.0, 20);
        latency.latency_ms = Some(Distribution { count: 10, p50: 12.0, p90: 20.0, p99: 30.0, max: 31.0 });
        let scenarios = vec![
            scenario_report(ScenarioName::PushB100, 30_000.0, 40),
            scenario_report(ScenarioName::PushB1, 1_000.0, 30),
            scenario_report(ScenarioName::Fanout0, 10_000.0, 60),
            scenario_report(ScenarioName::Fanout10, 6_000.0, 70),
            latency,
        ];
        let ceiling = CeilingReport {
            cell_seconds: 3.0,
            cells: vec![cell(100, 1, 50_000.0), cell(100, 10, 120_000.0), cell(10, 1, 9_000.0)],
        };
        let targets = check_targets(&scenarios, Some(&ceiling));
        let verdicts: Vec<Verdict> = targets.iter().map(|t| t.verdict).collect();
        assert_eq!(verdicts, [Verdict::Pass, Verdict::Miss, Verdict::Miss, Verdict::Pass]);
        assert_eq!(targets[0].value, Some(0.6));
        assert!(targets[0].measured.contains("best cell 120,000 msg/s"), "{}", targets[0].measured);
        assert_eq!(targets[1].shortfall.as_deref(), Some("25 % (0.60 < 0.8)"));
        assert_eq!(targets[2].shortfall.as_deref(), Some("2.0 ms (20 % over)"));
        // Only the push scenarios count for memory.
        assert_eq!(targets[3].value, Some(40.0));
    }

    #[test]
    fn missing_scenarios_are_not_measured() {
        let targets = check_targets(&[], None);
        assert!(targets.iter().all(|t| t.verdict == Verdict::NotMeasured && t.measured == "not run"));
    }

    #[test]
    fn markdown_has_the_targets_and_a_row_per_scenario() {
        let report = Report::new(
            Environment { nproc: 2, date: "2026-01-01T00:00:00Z".into(), ..Environment::default() },
            vec![scenario_report(ScenarioName::PushB10, 12_345.6, 30)],
            Some(CeilingReport { cell_seconds: 3.0, cells: vec![cell(100, 1, 50_000.0)] }),
        );
        let markdown = report.markdown();
        assert!(
            markdown
                .contains("| push-b10 | 12,346 | 0 | – | 12.5 | 0.50 / 0.80 / – / 0.10 (0.05) | 30.0 | 0 | **NO** |"),
            "{markdown}"
        );
        assert!(markdown.contains("| 100 | 1 | 4 | 500 | 50,000 | – |"), "{markdown}");
        assert!(markdown.contains("**not measured**"), "{markdown}");
        // A scenario without verification is not verified.
        assert!(!report.verified);
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0.4), "0");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(1000.0), "1,000");
        assert_eq!(thousands(1_234_567.8), "1,234,568");
    }
}
