//! The report of a run: the targets as ratios, every scenario's figures and verdict, the
//! ceiling, as JSON and as markdown.

use std::fmt::Write;
use std::path::Path;

use serde::Serialize;

use crate::ceiling::{CONNECTIONS, CeilingCell, CeilingReport, CellKind, MESSAGES_PER_SEGMENT};
use crate::environment::{Environment, fdatasync_ops};
use crate::rounds::Rounds;
use crate::scenarios::{ScenarioName, ScenarioReport, Sustain};
use crate::stats::Distribution;

/// The push scenarios' batch size that the ceiling comparison is about.
const CEILING_BATCH: usize = 100;
/// push-b100 against the `segments` cells of the ceiling: the rows a push writes besides its
/// segment must not cost it more than this.
const SEGMENTS_CEILING_MIN_RATIO: f64 = 0.8;
/// sustain-10 against sustain-1: ten groups keep up with at least this share of one group's rate.
const SUSTAIN_FANOUT_MIN_RATIO: f64 = 0.5;
const LATENCY_P50_MAX_MS: f64 = 5.0;
const PEAK_RSS_MAX_MIB: f64 = 48.0;
/// With `--compare-bin`: the headline of A over B's must reach these.
const COMPARE_MIN_RATIOS: [(ScenarioName, f64); 3] =
    [(ScenarioName::Sustain10, 2.0), (ScenarioName::Consume, 1.5), (ScenarioName::PushB1, 1.5)];
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

/// The second build of an A/B run, and what it measured.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// Build B's broker binary.
    pub broker: String,
    pub runs: Vec<ComparedRun>,
}

/// One scenario run with build B.
#[derive(Debug, Clone, Serialize)]
pub struct ComparedRun {
    /// B ran this scenario before A did.
    pub ran_first: bool,
    pub report: ScenarioReport,
}

impl Comparison {
    fn run(&self, name: ScenarioName) -> Option<&ComparedRun> {
        self.runs.iter().find(|r| r.report.scenario == name)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub environment: Environment,
    /// The scenarios, run with build A (the only build without `--compare-bin`).
    pub scenarios: Vec<ScenarioReport>,
    pub ceiling: Option<CeilingReport>,
    /// Build B's runs, with `--compare-bin`.
    pub compare: Option<Comparison>,
    pub targets: Vec<TargetCheck>,
    /// Every scenario, of either build, delivered every message to every group exactly once.
    pub verified: bool,
    /// What failed outside the scenarios (the ceiling, the suite's own set-up).
    pub failures: Vec<String>,
    /// Every round's headline, when the suite ran more than one round per scenario; each
    /// scenario's row above is then its median round ([`crate::rounds::representative`]).
    pub rounds: Vec<Rounds>,
}

impl Report {
    pub fn new(
        environment: Environment,
        scenarios: Vec<ScenarioReport>,
        ceiling: Option<CeilingReport>,
        compare: Option<Comparison>,
    ) -> Self {
        let targets = check_targets(&scenarios, ceiling.as_ref(), compare.as_ref(), &[]);
        let verified = all_runs(&scenarios, compare.as_ref()).all(|(_, s)| s.passed());
        Self { environment, scenarios, ceiling, compare, targets, verified, failures: Vec::new(), rounds: Vec::new() }
    }

    /// The report of several rounds per scenario: `rounds` lists them, and each target against
    /// build B gives its ratio round by round beside the ratio of the median rounds it is judged
    /// on, since the two can differ (1.64 · 1.67 · 2.00 round by round, 2.00 of the medians).
    pub fn with_rounds(mut self, rounds: Vec<Rounds>) -> Self {
        self.targets = check_targets(&self.scenarios, self.ceiling.as_ref(), self.compare.as_ref(), &rounds);
        self.rounds = rounds;
        self
    }

    /// Every problem that makes the run fail, one line each.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = self.failures.clone();
        for (build, scenario) in all_runs(&self.scenarios, self.compare.as_ref()) {
            let name = format!("{}{build}", scenario.scenario);
            if let Some(failure) = &scenario.failure {
                problems.push(format!("{name}: {failure}"));
            }
            for verification in &scenario.verification {
                problems.extend(verification.problems().into_iter().map(|p| format!("{name}: {p}")));
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
        if let Some(compare) = &self.compare {
            self.write_comparison(&mut out, compare);
        }
        self.write_rounds(&mut out);
        self.write_sustain(&mut out);
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
            let verified = yes_no(s.passed());
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

    fn write_comparison(&self, out: &mut String, compare: &Comparison) {
        let _ = writeln!(
            out,
            "A/B, A = the build named above, B = {}: each scenario ran with both, each on a fresh database and broker \
             process, alternating which went first (for e2e p50, lower is better).\n",
            compare.broker
        );
        let _ = writeln!(
            out,
            "| scenario | first | headline | A | B | A/B | broker CPU s per M msgs A / B (A/B) | broker peak RSS MiB A / \
             B (A/B) | verified A / B |"
        );
        let _ = writeln!(out, "|---|---|---|---:|---:|---:|---:|---:|---|");
        for a in &self.scenarios {
            let Some(b) = compare.run(a.scenario) else { continue };
            let first = if b.ran_first { "B" } else { "A" };
            let b = &b.report;
            let (label, value_a) = headline(a);
            let (_, value_b) = headline(b);
            let cpu = |s: &ScenarioReport| s.broker_cpu_s_per_million;
            let rss = |s: &ScenarioReport| s.peak_broker_rss_bytes.map(|r| r as f64 / MIB);
            let pair = |x: Option<f64>, y: Option<f64>| {
                format!(
                    "{} / {} ({})",
                    x.map_or_else(dash, |v| format!("{v:.1}")),
                    y.map_or_else(dash, |v| format!("{v:.1}")),
                    ratio_text(x, y)
                )
            };
            let _ = writeln!(
                out,
                "| {} | {first} | {label} | {} | {} | **{}** | {} | {} | {} / {} |",
                a.scenario,
                value_a.map_or_else(dash, |v| figure(label, v)),
                value_b.map_or_else(dash, |v| figure(label, v)),
                ratio_text(value_a, value_b),
                pair(cpu(a), cpu(b)),
                pair(rss(a), rss(b)),
                yes_no(a.passed()),
                yes_no(b.passed()),
            );
        }
        out.push('\n');
    }

    fn write_rounds(&self, out: &mut String) {
        if self.rounds.iter().all(|r| r.a.len() < 2 && r.b.len() < 2) {
            return;
        }
        let times = self.rounds.iter().map(|r| r.a.len()).max().unwrap_or(0);
        let per_build = match self.compare {
            Some(_) => " per build (alternating which build went first)",
            None => "",
        };
        let _ = writeln!(
            out,
            "Rounds: each scenario ran {times} times{per_build}, and each row above is its median round (of an \
             even count, the lower middle; a round that failed stands for them all). Every round's headline, in \
             the order they ran:\n"
        );
        let _ = writeln!(out, "| scenario | headline | A | B | A/B, round by round |\n|---|---|---|---|---|");
        for rounds in &self.rounds {
            let Some(run) = scenario(&self.scenarios, rounds.scenario) else { continue };
            let (label, _) = headline(run);
            let listed = |values: &[Option<f64>]| {
                values.iter().map(|v| v.map_or_else(dash, |v| figure(label, v))).collect::<Vec<_>>().join(" · ")
            };
            let ratios = round_ratios(rounds);
            let _ = writeln!(
                out,
                "| {} | {label} | {} | {} | {} |",
                rounds.scenario,
                listed(&rounds.a),
                if rounds.b.is_empty() { dash() } else { listed(&rounds.b) },
                if ratios.is_empty() { dash() } else { ratios.join(" · ") },
            );
        }
        out.push('\n');
    }

    fn write_sustain(&self, out: &mut String) {
        for s in &self.scenarios {
            let Some(sustain) = &s.sustain else { continue };
            write_sustain_search(out, s.scenario, sustain, "");
            if let Some(fanout) = s.scenario.fanout_of_sustain().and_then(|f| scenario(&self.scenarios, f)) {
                let _ = writeln!(
                    out,
                    "Unconstrained, `{}` pushed {} msg/s while its groups received {} msg/s in all.\n",
                    fanout.scenario,
                    fanout.pushed_per_s.map_or_else(dash, thousands),
                    fanout.delivered_per_s.map_or_else(dash, thousands),
                );
            }
            let compared = self.compare.as_ref().and_then(|c| c.run(s.scenario));
            if let Some(sustain) = compared.and_then(|b| b.report.sustain.as_ref()) {
                write_sustain_search(out, s.scenario, sustain, " (build B)");
            }
        }
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
        let errors: Vec<String> = all_runs(&self.scenarios, self.compare.as_ref())
            .flat_map(|(build, s)| s.errors.first.iter().map(move |e| format!("{}{build}: {e}", s.scenario)))
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

/// The runs of both builds, each with the suffix that names its build in messages.
fn all_runs<'a>(
    scenarios: &'a [ScenarioReport],
    compare: Option<&'a Comparison>,
) -> impl Iterator<Item = (&'static str, &'a ScenarioReport)> {
    let b = compare.into_iter().flat_map(|c| c.runs.iter().map(|r| (" (B)", &r.report)));
    scenarios.iter().map(|s| ("", s)).chain(b)
}

fn write_sustain_search(out: &mut String, name: ScenarioName, sustain: &Sustain, build: &str) {
    let best = sustain.sustainable_step();
    let kept = match (sustain.sustainable_per_s, best) {
        (Some(rate), Some(step)) => format!(
            "**{} msg/s** kept up with ({} deliveries/s in all)",
            thousands(rate),
            thousands(step.delivered_per_s)
        ),
        _ => "**no rate** kept up with".to_owned(),
    };
    let failed = sustain
        .failed_per_s
        .map_or_else(|| "no rate tried was missed".to_owned(), |r| format!("{} msg/s was not", thousands(r)));
    let latency = best.and_then(|s| s.latency_ms.as_ref()).map_or_else(String::new, |d| {
        format!("; e2e p50 / p99 at the sustainable rate {:.1} / {:.1} ms", d.p50, d.p99)
    });
    let _ = writeln!(
        out,
        "Sustainable fan-out ({name}{build}, {} group{}): {kept}; {failed}{latency}. The search ended because {}.\n",
        sustain.groups,
        if sustain.groups == 1 { "" } else { "s" },
        sustain.ended
    );
    let _ = writeln!(
        out,
        "| offered msg/s | pushed msg/s | delivered msg/s | max lag (bound) | e2e ms p50 / p99 | cores: broker / \
         PostgreSQL | kept up |"
    );
    let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---|");
    for step in &sustain.steps {
        let cpu = step.measured.cpu;
        let share = |c: Option<f64>| c.map_or_else(dash, |c| format!("{:.2}", c / cpu.wall_s.max(1e-9)));
        let kept_up = if step.kept_up { "yes".to_owned() } else { format!("no: {}", step.missed.join("; ")) };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} ({}) | {} | {} / {} | {kept_up} |",
            thousands(step.offered_per_s),
            thousands(step.pushed_per_s),
            thousands(step.delivered_per_s),
            thousands(step.max_lag as f64),
            thousands(step.lag_bound as f64),
            step.latency_ms.map_or_else(dash, |d| format!("{:.1} / {:.1}", d.p50, d.p99)),
            share(cpu.broker_s),
            share(cpu.postgres_s),
        );
    }
    out.push('\n');
}

/// The ratios between kinds that say what each part of an append costs.
const CEILING_RATIOS: [(&str, CellKind, CellKind); 3] = [
    ("rows / segments: what the per-message rows cost", CellKind::Rows, CellKind::Segments),
    ("rows+notify / rows: what the in-transaction NOTIFY costs", CellKind::RowsNotify, CellKind::Rows),
    ("append / segments", CellKind::Append, CellKind::Segments),
];

fn write_ceiling(out: &mut String, ceiling: &CeilingReport) {
    let _ = writeln!(
        out,
        "Storage ceiling (no broker; {:.0} s per cell), msgs/s at one segment per transaction. `append`: the \
         production code (`append_in_transaction`: partition lock, duplicate check, compression, its statement); \
         `rows+notify`: that statement as of a5a7ae9, written out in the bench; `rows`: the same without the \
         `pg_notify`; `segments`: the segment row alone.\n",
        ceiling.cell_seconds
    );
    for size in MESSAGES_PER_SEGMENT {
        let msgs_per_s =
            |kind: CellKind, connections: usize| ceiling.cell(kind, size, connections).map(|c| c.messages_per_s);
        let _ = write!(out, "| {size} msgs/segment |");
        for connections in CONNECTIONS {
            let _ = write!(out, " {connections} conn. |");
        }
        let _ = writeln!(out, "\n|---|{}", "---:|".repeat(CONNECTIONS.len()));
        for kind in CellKind::ALL {
            let _ = write!(out, "| {kind} |");
            for connections in CONNECTIONS {
                let _ = write!(out, " {} |", msgs_per_s(kind, connections).map_or_else(dash, thousands));
            }
            out.push('\n');
        }
        for (label, over, under) in CEILING_RATIOS {
            let _ = write!(out, "| {label} |");
            for connections in CONNECTIONS {
                let _ = write!(out, " {} |", ratio_text(msgs_per_s(over, connections), msgs_per_s(under, connections)));
            }
            out.push('\n');
        }
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "| kind | msgs/segment | segments/tx | connections | segments/s | msgs/s | tx ms p50 / p90 / p99 / max |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|");
    for cell in &ceiling.cells {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            cell.shape.kind,
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

/// The one figure of a scenario an A/B comparison is about: its name, and the value.
pub(crate) fn headline(s: &ScenarioReport) -> (&'static str, Option<f64>) {
    match s.scenario {
        ScenarioName::Consume
        | ScenarioName::Partitions1
        | ScenarioName::Partitions1000
        | ScenarioName::Partitions10000 => ("delivered msg/s", s.delivered_per_s),
        ScenarioName::Sustain1 | ScenarioName::Sustain10 => {
            // A search that kept up with no rate sustains nothing.
            ("sustainable msg/s", s.sustain.as_ref().map(|x| x.sustainable_per_s.unwrap_or(0.0)))
        }
        ScenarioName::E2eLatency => ("e2e p50 ms", s.latency_ms.map(|d| d.p50)),
        ScenarioName::PushB1
        | ScenarioName::PushB10
        | ScenarioName::PushB100
        | ScenarioName::Fanout0
        | ScenarioName::Fanout1
        | ScenarioName::Fanout5
        | ScenarioName::Fanout10 => ("pushed msg/s", s.pushed_per_s),
    }
}

/// A headline value as the report writes it.
fn figure(label: &str, value: f64) -> String {
    if label.ends_with(" ms") { format!("{value:.2}") } else { thousands(value) }
}

/// A/B of each round that ran with both builds, in the order they ran.
fn round_ratios(rounds: &Rounds) -> Vec<String> {
    rounds.a.iter().zip(&rounds.b).map(|(a, b)| ratio_text(*a, *b)).collect()
}

fn ratio_text(over: Option<f64>, under: Option<f64>) -> String {
    match (over, under) {
        (Some(over), Some(under)) if under > 0.0 => format!("{:.2}", over / under),
        _ => dash(),
    }
}

fn yes_no(passed: bool) -> &'static str {
    if passed { "yes" } else { "**NO**" }
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

fn check_targets(
    scenarios: &[ScenarioReport],
    ceiling: Option<&CeilingReport>,
    compare: Option<&Comparison>,
    rounds: &[Rounds],
) -> Vec<TargetCheck> {
    let mut targets = vec![
        ceiling_target(scenarios, ceiling),
        sustain_target(scenarios),
        latency_target(scenarios),
        rss_target(scenarios),
    ];
    if let Some(compare) = compare {
        targets.extend(COMPARE_MIN_RATIOS.iter().map(|&(name, min)| {
            let rounds = rounds.iter().find(|r| r.scenario == name);
            compare_target(scenarios, compare, rounds, name, min)
        }));
    }
    targets.push(verified_target(scenarios, compare));
    targets
}

fn not_run() -> String {
    "not run".to_owned()
}

fn ceiling_target(scenarios: &[ScenarioReport], ceiling: Option<&CeilingReport>) -> TargetCheck {
    let push = scenario(scenarios, ScenarioName::PushB100).and_then(|s| s.pushed_per_s);
    let cell = ceiling.and_then(|c| c.fastest(CellKind::Segments, CEILING_BATCH));
    let append = ceiling.and_then(|c| c.fastest(CellKind::Append, CEILING_BATCH));
    let ratio = push.zip(cell).map(|(p, c)| p / c.messages_per_s);
    let described = |cell: &CeilingCell| {
        format!("{} msg/s ({} connections)", thousands(cell.messages_per_s), cell.shape.connections)
    };
    let measured = match (push, cell, ratio) {
        (Some(push), Some(cell), Some(ratio)) => {
            let mut text =
                format!("push-b100 {} msg/s ÷ `segments` cell {} = **{ratio:.2}**", thousands(push), described(cell));
            if let Some(append) = append {
                let _ = write!(
                    text,
                    "; ÷ fastest `append` cell {}: {:.2}",
                    described(append),
                    push / append.messages_per_s
                );
            }
            text
        }
        _ => not_run(),
    };
    at_least(
        format!(
            "push at batch {CEILING_BATCH} ≥ {SEGMENTS_CEILING_MIN_RATIO} × the `segments` ceiling of {CEILING_BATCH} \
             msgs/segment"
        ),
        measured,
        ratio,
        SEGMENTS_CEILING_MIN_RATIO,
    )
}

fn sustainable(scenarios: &[ScenarioReport], name: ScenarioName) -> Option<f64> {
    scenario(scenarios, name).and_then(|s| headline(s).1)
}

fn sustain_target(scenarios: &[ScenarioReport]) -> TargetCheck {
    let ten = sustainable(scenarios, ScenarioName::Sustain10);
    let one = sustainable(scenarios, ScenarioName::Sustain1);
    let ratio = ten.zip(one).and_then(|(ten, one)| (one > 0.0).then_some(ten / one));
    let measured = match (ten, one) {
        (Some(ten), Some(one)) => format!(
            "sustain-10 {} msg/s ÷ sustain-1 {} msg/s = **{}**",
            thousands(ten),
            thousands(one),
            ratio_text(Some(ten), Some(one))
        ),
        _ => not_run(),
    };
    at_least(
        format!("sustainable push rate with 10 groups ≥ {SUSTAIN_FANOUT_MIN_RATIO} × with 1"),
        measured,
        ratio,
        SUSTAIN_FANOUT_MIN_RATIO,
    )
}

fn latency_target(scenarios: &[ScenarioReport]) -> TargetCheck {
    let p50 = scenario(scenarios, ScenarioName::E2eLatency).and_then(|s| s.latency_ms).map(|d| d.p50);
    below(
        format!("e2e p50 at light load < {LATENCY_P50_MAX_MS} ms"),
        p50.map_or_else(not_run, |p| format!("p50 **{p:.2} ms**")),
        p50,
        LATENCY_P50_MAX_MS,
        "ms",
    )
}

fn rss_target(scenarios: &[ScenarioReport]) -> TargetCheck {
    let peak = scenarios.iter().filter_map(|s| Some((s.scenario, s.peak_broker_rss_bytes?))).max_by_key(|(_, b)| *b);
    below(
        format!("broker peak RSS < {PEAK_RSS_MAX_MIB} MiB in every scenario"),
        peak.map_or_else(not_run, |(name, bytes)| format!("highest **{:.1} MiB** (in {name})", bytes as f64 / MIB)),
        peak.map(|(_, bytes)| bytes as f64 / MIB),
        PEAK_RSS_MAX_MIB,
        "MiB",
    )
}

fn compare_target(
    scenarios: &[ScenarioReport],
    compare: &Comparison,
    rounds: Option<&Rounds>,
    name: ScenarioName,
    min: f64,
) -> TargetCheck {
    let a = scenario(scenarios, name).map(headline);
    let b = compare.run(name).filter(|b| b.report.failure.is_none()).map(|b| headline(&b.report));
    let (label, value_a, value_b) = match (a, b) {
        (Some((label, a)), Some((_, b))) => (label, a, b),
        _ => ("", None, None),
    };
    let ratio = value_a.zip(value_b).and_then(|(a, b)| (b > 0.0).then_some(a / b));
    let by_round = rounds.map(round_ratios).filter(|ratios| ratios.len() > 1);
    let measured = match (value_a, value_b) {
        (Some(a), Some(b)) => format!(
            "{name} {label}: A {} ÷ B {} = **{}**{}",
            figure(label, a),
            figure(label, b),
            ratio_text(Some(a), Some(b)),
            by_round
                .map(|ratios| format!(" (median rounds; round by round {})", ratios.join(" · ")))
                .unwrap_or_default()
        ),
        _ => not_run(),
    };
    at_least(format!("{name} ≥ {min} × build B's"), measured, ratio, min)
}

fn verified_target(scenarios: &[ScenarioReport], compare: Option<&Comparison>) -> TargetCheck {
    let runs: Vec<(&str, &ScenarioReport)> = all_runs(scenarios, compare).collect();
    let failed: Vec<String> =
        runs.iter().filter(|(_, s)| !s.passed()).map(|(build, s)| format!("{}{build}", s.scenario)).collect();
    let (verdict, shortfall) = match (runs.len(), failed.len()) {
        (0, _) => (Verdict::NotMeasured, None),
        (_, 0) => (Verdict::Pass, None),
        (_, n) => (Verdict::Miss, Some(format!("{n}: {}", failed.join(", ")))),
    };
    TargetCheck {
        target: "every scenario verified (every message delivered to every group exactly once)".into(),
        measured: if runs.is_empty() {
            not_run()
        } else {
            format!("**{} of {}** runs verified", runs.len() - failed.len(), runs.len())
        },
        value: (!runs.is_empty()).then_some(failed.len() as f64),
        verdict,
        shortfall,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ceiling::CellShape;
    use crate::ledger::Verification;
    use crate::procfs::CpuUsage;
    use crate::scenarios::SustainStep;
    use crate::workload::{ErrorCounts, Measured};

    fn measured(pushed_per_s: f64) -> Measured {
        Measured {
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
        }
    }

    pub(crate) fn scenario_report(name: ScenarioName, pushed_per_s: f64, rss_mib: u64) -> ScenarioReport {
        ScenarioReport {
            scenario: name,
            shape: "a shape".into(),
            measured: Some(measured(pushed_per_s)),
            pushed_per_s: Some(pushed_per_s),
            delivered_per_s: Some(0.0),
            latency_ms: None,
            broker_cpu_s_per_million: Some(12.5),
            peak_broker_rss_bytes: Some(rss_mib * 1024 * 1024),
            fairness: None,
            candidate_plans: None,
            sustain: None,
            verification: vec![],
            errors: ErrorCounts::default(),
            failure: None,
        }
    }

    pub(crate) fn verified(mut report: ScenarioReport) -> ScenarioReport {
        report.verification =
            vec![Verification { stream: "s".into(), queued: 1, duplicate_answers: 0, uncertain: 0, groups: vec![] }];
        report
    }

    fn sustain_report(name: ScenarioName, sustainable: Option<f64>) -> ScenarioReport {
        let mut report = scenario_report(name, sustainable.unwrap_or(0.0), 20);
        let step = |offered: f64, kept_up: bool| SustainStep {
            offered_per_s: offered,
            pushed_per_s: offered,
            delivered_per_s: offered,
            max_lag: 10,
            lag_bound: 200,
            kept_up,
            missed: if kept_up { vec![] } else { vec!["lag 900 > 200".into()] },
            latency_ms: None,
            measured: measured(offered),
        };
        let mut steps: Vec<SustainStep> = sustainable.into_iter().map(|r| step(r, true)).collect();
        steps.push(step(100_000.0, false));
        report.sustain = Some(Sustain {
            groups: 1,
            sustainable_per_s: sustainable,
            failed_per_s: Some(100_000.0),
            steps,
            ended: "the bracket is as narrow as asked".into(),
        });
        report
    }

    fn cell(kind: CellKind, messages_per_segment: usize, connections: usize, messages_per_s: f64) -> CeilingCell {
        CeilingCell {
            shape: CellShape { kind, messages_per_segment, segments_per_transaction: 1, connections },
            seconds: 3.0,
            segments_per_s: messages_per_s / messages_per_segment as f64,
            messages_per_s,
            transaction_ms: None,
        }
    }

    fn ceiling() -> CeilingReport {
        CeilingReport {
            cell_seconds: 3.0,
            cells: vec![
                cell(CellKind::Segments, 100, 1, 40_000.0),
                cell(CellKind::Segments, 100, 8, 50_000.0),
                cell(CellKind::Rows, 100, 8, 25_000.0),
                cell(CellKind::RowsNotify, 100, 8, 20_000.0),
                cell(CellKind::Append, 100, 8, 18_000.0),
                // Faster, but not the kind the target is about.
                cell(CellKind::Segments, 10, 8, 90_000.0),
            ],
        }
    }

    #[test]
    fn targets_are_ratios_with_their_shortfall() {
        let mut latency = scenario_report(ScenarioName::E2eLatency, 50.0, 20);
        latency.latency_ms = Some(Distribution { count: 10, p50: 6.0, p90: 20.0, p99: 30.0, max: 31.0 });
        let scenarios = vec![
            verified(scenario_report(ScenarioName::PushB100, 30_000.0, 40)),
            verified(scenario_report(ScenarioName::PushB1, 1_000.0, 30)),
            verified(sustain_report(ScenarioName::Sustain1, Some(4_000.0))),
            verified(sustain_report(ScenarioName::Sustain10, Some(1_000.0))),
            scenario_report(ScenarioName::Fanout10, 6_000.0, 60),
            verified(latency),
        ];
        let targets = check_targets(&scenarios, Some(&ceiling()), None, &[]);
        let verdicts: Vec<Verdict> = targets.iter().map(|t| t.verdict).collect();
        assert_eq!(verdicts, [Verdict::Miss, Verdict::Miss, Verdict::Miss, Verdict::Miss, Verdict::Miss]);
        // push-b100 against the fastest `segments` cell of 100 msgs/segment.
        assert_eq!(targets[0].value, Some(0.6));
        assert!(
            targets[0].measured.contains("`segments` cell 50,000 msg/s (8 connections)"),
            "{}",
            targets[0].measured
        );
        assert!(
            targets[0].measured.contains("`append` cell 18,000 msg/s (8 connections): 1.67"),
            "{}",
            targets[0].measured
        );
        assert_eq!(targets[0].shortfall.as_deref(), Some("25 % (0.60 < 0.8)"));
        assert_eq!(targets[1].value, Some(0.25));
        assert_eq!(targets[2].shortfall.as_deref(), Some("1.0 ms (20 % over)"));
        // Every scenario counts for memory, not only the push scenarios.
        assert_eq!(targets[3].value, Some(60.0));
        assert!(targets[3].measured.contains("fanout-10"), "{}", targets[3].measured);
        assert_eq!(targets[4].shortfall.as_deref(), Some("1: fanout-10"));
    }

    #[test]
    fn a_search_that_kept_up_with_nothing_sustains_zero() {
        let scenarios =
            vec![sustain_report(ScenarioName::Sustain1, Some(2_000.0)), sustain_report(ScenarioName::Sustain10, None)];
        let target = sustain_target(&scenarios);
        assert_eq!((target.value, target.verdict), (Some(0.0), Verdict::Miss));
    }

    #[test]
    fn comparisons_add_targets_on_build_b() {
        let a = vec![
            verified(sustain_report(ScenarioName::Sustain10, Some(3_000.0))),
            verified(scenario_report(ScenarioName::PushB1, 1_400.0, 30)),
        ];
        let runs = vec![
            ComparedRun { ran_first: false, report: verified(sustain_report(ScenarioName::Sustain10, Some(1_000.0))) },
            ComparedRun { ran_first: true, report: scenario_report(ScenarioName::PushB1, 1_000.0, 30) },
        ];
        let compare = Comparison { broker: "old/queen".into(), runs };
        let targets = check_targets(&a, None, Some(&compare), &[]);
        let named = |name: &str| targets.iter().find(|t| t.target.starts_with(name)).unwrap();
        assert_eq!(named("sustain-10 ≥ 2").verdict, Verdict::Pass);
        assert_eq!(named("sustain-10 ≥ 2").value, Some(3.0));
        assert_eq!(named("push-b1 ≥ 1.5").verdict, Verdict::Miss);
        assert_eq!(named("consume ≥ 1.5").verdict, Verdict::NotMeasured);
        // Build B's runs must verify too.
        let every = named("every scenario verified");
        assert_eq!(every.shortfall.as_deref(), Some("1: push-b1 (B)"));
        assert!(every.measured.contains("3 of 4"), "{}", every.measured);

        let report = Report::new(Environment::default(), a, None, Some(compare));
        assert!(!report.verified);
        assert!(report.problems().is_empty(), "no verification ran, so nothing names a problem");
        let markdown = report.markdown();
        assert!(
            markdown.contains(
                "| sustain-10 | A | sustainable msg/s | 3,000 | 1,000 | **3.00** | 12.5 / 12.5 (1.00) | 20.0 / 20.0 \
                 (1.00) | yes / yes |"
            ),
            "{markdown}"
        );
        assert!(markdown.contains("| push-b1 | B | pushed msg/s | 1,400 | 1,000 | **1.40** |"), "{markdown}");
        assert!(markdown.contains("Sustainable fan-out (sustain-10 (build B), 1 group)"), "{markdown}");
        assert!(!markdown.contains("Rounds:"), "one round each: no rounds table");
    }

    #[test]
    fn rounds_are_listed_with_their_ratios_round_by_round() {
        let a = vec![verified(scenario_report(ScenarioName::PushB1, 1_400.0, 30))];
        let runs =
            vec![ComparedRun { ran_first: true, report: verified(scenario_report(ScenarioName::PushB1, 1_000.0, 30)) }];
        let report = Report::new(Environment::default(), a, None, Some(Comparison { broker: "b".into(), runs }))
            .with_rounds(vec![Rounds {
                scenario: ScenarioName::PushB1,
                a: vec![Some(1_400.0), Some(1_500.0), Some(900.0)],
                b: vec![Some(1_000.0), Some(1_000.0), None],
            }]);
        let markdown = report.markdown();
        assert!(markdown.contains("each scenario ran 3 times per build"), "{markdown}");
        assert!(
            markdown.contains("A 1,400 ÷ B 1,000 = **1.40** (median rounds; round by round 1.40 · 1.50 · –)"),
            "the target gives the rounds' ratios too: {markdown}"
        );
        assert!(
            markdown.contains("| push-b1 | pushed msg/s | 1,400 · 1,500 · 900 | 1,000 · 1,000 · – | 1.40 · 1.50 · – |"),
            "{markdown}"
        );
    }

    #[test]
    fn missing_scenarios_are_not_measured() {
        let targets = check_targets(&[], None, None, &[]);
        assert!(targets.iter().all(|t| t.verdict == Verdict::NotMeasured && t.measured == "not run"));
    }

    #[test]
    fn markdown_has_the_targets_a_row_per_scenario_and_the_ceiling_ratios() {
        let report = Report::new(
            Environment { nproc: 2, date: "2026-01-01T00:00:00Z".into(), ..Environment::default() },
            vec![
                scenario_report(ScenarioName::PushB10, 12_345.6, 30),
                sustain_report(ScenarioName::Sustain1, Some(4_000.0)),
                scenario_report(ScenarioName::Fanout1, 8_000.0, 30),
            ],
            Some(ceiling()),
            None,
        );
        let markdown = report.markdown();
        assert!(
            markdown
                .contains("| push-b10 | 12,346 | 0 | – | 12.5 | 0.50 / 0.80 / – / 0.10 (0.05) | 30.0 | 0 | **NO** |"),
            "{markdown}"
        );
        assert!(markdown.contains("| segments | 40,000 | – | 50,000 |"), "{markdown}");
        assert!(markdown.contains("| rows / segments: what the per-message rows cost | – | – | 0.50 |"), "{markdown}");
        assert!(
            markdown.contains("| rows+notify / rows: what the in-transaction NOTIFY costs | – | – | 0.80 |"),
            "{markdown}"
        );
        assert!(markdown.contains("| append / segments | – | – | 0.36 |"), "{markdown}");
        assert!(markdown.contains("| segments | 100 | 1 | 8 | 500 | 50,000 | – |"), "{markdown}");
        assert!(markdown.contains("**4,000 msg/s** kept up with"), "{markdown}");
        assert!(
            markdown.contains("| 100,000 | 100,000 | 100,000 | 10 (200) | – | 0.50 / 0.80 | no: lag 900 > 200 |"),
            "{markdown}"
        );
        assert!(markdown.contains("Unconstrained, `fanout-1` pushed 8,000 msg/s"), "{markdown}");
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
