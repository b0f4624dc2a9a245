//! `flotilla bench`: throughput, dispatch latency, memory and scaling of the actor pipeline
//! (`throughput`), the makespan of dispatch policies on virtual time (`makespan`), and the
//! largest request the root planner sends (`requests`, ADR-030), and with `--landing` the
//! path a real task takes through a daemon, workspace to landing (`landing`, ADR-041), and
//! with `--gate-timing` a real project's build as the merge gate, cold and warm (`gate_timing`).
//!
//! Each measurement prints as it finishes: a table for people, or with `--json` one JSON
//! object per line. Numbers on a busy machine vary: compare medians of several runs, and
//! ratios (memory/SQLite, 50k/1k) rather than single values.

pub mod gate_timing;
pub mod landing;
pub mod landing_repo;
pub mod makespan;
pub mod requests;
pub mod throughput;

use std::io::Write;

use serde::Serialize;

use makespan::MakespanError;
use requests::RequestsError;
use throughput::{JournalKind, Shape, Throughput, ThroughputError, ThroughputResult};

/// What `flotilla bench` measures (see `flotilla bench --help`).
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Independent instant tasks in the throughput runs.
    pub tasks: usize,
    /// Tasks in the chain run (each depends on the one before); 0 leaves it out.
    pub chain: usize,
    /// Sizes of the scaling runs (independent tasks, SQLite); empty leaves them out.
    pub scaling: Vec<usize>,
    /// Worker slots of the throughput runs.
    pub workers: usize,
    /// Also the makespan simulations.
    pub makespan: bool,
    /// Also the planner's largest requests.
    pub requests: bool,
    /// Runs of `tasks` tasks (SQLite) one after another, with the resident set measured
    /// after each, against the idle one; 0 leaves them out.
    pub memory_runs: usize,
    pub json: bool,
}

/// One measurement, as `--json` prints it. Fields that do not apply are `null`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Measurement {
    pub name: String,
    pub tasks: usize,
    /// `sqlite` or `memory`; `none` for a simulation.
    pub journal: &'static str,
    pub workers: usize,
    pub tasks_per_s: Option<f64>,
    pub events_per_s: Option<f64>,
    pub dispatch_p50_us: Option<f64>,
    pub dispatch_p99_us: Option<f64>,
    pub dispatch_max_us: Option<f64>,
    pub peak_rss_bytes: Option<u64>,
    /// Wall time per task, for the scaling rows.
    pub per_task_us: Option<f64>,
    /// The memory rows: the resident set after the run (and a collection point), and how
    /// far above the idle one it is.
    pub rss_bytes: Option<u64>,
    pub rss_above_idle_bytes: Option<i64>,
    /// The makespan rows.
    pub policy: Option<&'static str>,
    pub makespan_over_lower_bound: Option<f64>,
    pub makespan_secs: Option<f64>,
    pub lower_bound_secs: Option<f64>,
    pub seed: Option<u64>,
    /// The requests rows: how many the planner sent, the largest (bytes of its JSON).
    pub requests: Option<usize>,
    pub largest_request_bytes: Option<usize>,
    /// The landing rows: files on main before the run, the gate (if any), what landed and
    /// how fast, the daemon's CPU per landed task, the per-task spans (ms), the daemon's
    /// peak RSS (in `peak_rss_bytes`) and the disk used after the run.
    pub files: Option<usize>,
    pub gate: Option<String>,
    pub landed: Option<usize>,
    pub landed_per_s: Option<f64>,
    pub cpu_ms_per_task: Option<f64>,
    pub dispatch_landed_p50_ms: Option<u64>,
    pub dispatch_landed_p99_ms: Option<u64>,
    pub started_landing_p50_ms: Option<u64>,
    /// The phases around the worker's part: ready → dispatched (before dispatch → landed),
    /// dispatched → started, landing → landed.
    pub ready_dispatched_p50_ms: Option<u64>,
    pub dispatched_started_p50_ms: Option<u64>,
    pub landing_landed_p50_ms: Option<u64>,
    /// landing → landed split at the journaled intent (`landing_intended`): the queue's wait
    /// and build, then moving main and what follows it.
    pub landing_intended_p50_ms: Option<u64>,
    pub intended_landed_p50_ms: Option<u64>,
    pub disk_bytes: Option<u64>,
    /// Making the case's repository (template from the cache, or generated, and checked out).
    pub prepare_ms: Option<u64>,
}

impl Measurement {
    /// A landing row.
    pub fn of_landing(
        case: &landing::LandingCase,
        r: &landing::LandingResult,
        prepare_ms: u64,
    ) -> Self {
        Measurement {
            name: format!("landing/{}-files", case.files),
            tasks: case.tasks,
            journal: "sqlite",
            workers: case.workers,
            peak_rss_bytes: r.daemon.peak_rss_bytes,
            files: Some(case.files),
            gate: case.gate.clone(),
            landed: Some(r.landed),
            landed_per_s: Some(round(r.landed_per_s(), 2)),
            cpu_ms_per_task: Some(round(r.cpu_ms_per_task(), 1)),
            dispatch_landed_p50_ms: Some(landing::quantile_ms(&r.dispatch_to_landed_ms, 0.5)),
            dispatch_landed_p99_ms: Some(landing::quantile_ms(&r.dispatch_to_landed_ms, 0.99)),
            started_landing_p50_ms: Some(landing::quantile_ms(&r.started_to_landing_ms, 0.5)),
            ready_dispatched_p50_ms: Some(landing::quantile_ms(&r.ready_to_dispatched_ms, 0.5)),
            dispatched_started_p50_ms: Some(landing::quantile_ms(&r.dispatched_to_started_ms, 0.5)),
            landing_landed_p50_ms: Some(landing::quantile_ms(&r.landing_to_landed_ms, 0.5)),
            landing_intended_p50_ms: Some(landing::quantile_ms(&r.landing_to_intended_ms, 0.5)),
            intended_landed_p50_ms: Some(landing::quantile_ms(&r.intended_to_landed_ms, 0.5)),
            disk_bytes: Some(r.daemon.disk_bytes),
            prepare_ms: Some(prepare_ms),
            ..Measurement::default()
        }
    }
}

impl Measurement {
    fn of_throughput(
        name: String,
        workers: usize,
        journal: JournalKind,
        r: &ThroughputResult,
    ) -> Self {
        Measurement {
            name,
            tasks: r.tasks,
            journal: journal.as_str(),
            workers,
            tasks_per_s: Some(round(r.tasks_per_s(), 1)),
            events_per_s: Some(round(r.events_per_s(), 1)),
            dispatch_p50_us: Some(round(r.dispatch_us(0.50), 1)),
            dispatch_p99_us: Some(round(r.dispatch_us(0.99), 1)),
            dispatch_max_us: Some(round(r.dispatch_us(1.0), 1)),
            peak_rss_bytes: r.peak_rss_bytes,
            per_task_us: Some(round(
                r.elapsed.as_secs_f64() * 1e6 / r.tasks.max(1) as f64,
                2,
            )),
            ..Measurement::default()
        }
    }
}

fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

/// Why the bench stopped: the run that failed, or the output that could not be written.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("the warm-up run: {0}")]
    WarmUp(#[source] ThroughputError),
    #[error("{shape} run of {tasks} tasks: {source}")]
    Throughput {
        shape: &'static str,
        tasks: usize,
        #[source]
        source: ThroughputError,
    },
    #[error("scaling run of {tasks} tasks: {source}")]
    Scaling {
        tasks: usize,
        #[source]
        source: ThroughputError,
    },
    #[error("memory run {run} of {tasks} tasks: {source}")]
    Memory {
        run: usize,
        tasks: usize,
        #[source]
        source: ThroughputError,
    },
    #[error(transparent)]
    Makespan(#[from] MakespanError),
    #[error("the requests measurement: {0}")]
    Requests(#[from] RequestsError),
    #[error("writing the results: {0}")]
    Write(#[source] std::io::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// Runs every measurement `options` asks for, printing each as it finishes. Each
/// throughput run has an actix system of its own on this thread: call it outside any
/// async runtime.
pub fn run(options: &BenchOptions, out: &mut dyn Write) -> Result<Vec<Measurement>, BenchError> {
    // What the memory rows compare with: the process after a tiny run, so that what any
    // run sets up once (SQLite, the runtimes' statics) counts as idle, as in a daemon that
    // has served one run; then every later run must give back what it took.
    let idle = if options.memory_runs > 0 {
        throughput::run(&Throughput {
            tasks: 10,
            shape: Shape::Independent,
            journal: JournalKind::Sqlite,
            workers: options.workers,
        })
        .map_err(BenchError::WarmUp)?;
        collected_rss()
    } else {
        None
    };
    let mut printer = Printer::new(options.json, out);
    let mut all = Vec::new();
    let throughput_runs: Vec<(Shape, usize)> = [
        (Shape::Independent, options.tasks),
        (Shape::Chain, options.chain),
    ]
    .into_iter()
    .filter(|(_, n)| *n > 0)
    .collect();
    for (shape, tasks) in throughput_runs {
        for journal in [JournalKind::Sqlite, JournalKind::Memory] {
            let config = Throughput {
                tasks,
                shape,
                journal,
                workers: options.workers,
            };
            let result = throughput::run(&config).map_err(|source| BenchError::Throughput {
                shape: shape.as_str(),
                tasks,
                source,
            })?;
            let m = Measurement::of_throughput(
                format!("throughput/{}", shape.as_str()),
                options.workers,
                journal,
                &result,
            );
            printer.throughput(&m)?;
            all.push(m);
        }
    }
    let mut scaling: Vec<Measurement> = Vec::new();
    for &tasks in &options.scaling {
        let config = Throughput {
            tasks,
            shape: Shape::Independent,
            journal: JournalKind::Sqlite,
            workers: options.workers,
        };
        let result =
            throughput::run(&config).map_err(|source| BenchError::Scaling { tasks, source })?;
        let m = Measurement::of_throughput(
            format!("scaling/{tasks}"),
            options.workers,
            JournalKind::Sqlite,
            &result,
        );
        printer.scaling(&m, scaling.first())?;
        scaling.push(m);
    }
    all.extend(scaling);
    if options.makespan {
        for workload in makespan::default_workloads() {
            for row in makespan::run(&workload)? {
                let m = Measurement {
                    name: format!("makespan/{}", row.workload),
                    tasks: row.tasks,
                    journal: "none",
                    workers: row.workers,
                    policy: Some(row.policy.as_str()),
                    makespan_over_lower_bound: Some(round(row.makespan_over_lower_bound, 4)),
                    makespan_secs: Some(round(row.makespan_secs, 1)),
                    lower_bound_secs: Some(round(row.lower_bound_secs, 1)),
                    seed: Some(row.seed),
                    ..Measurement::default()
                };
                printer.makespan(&m)?;
                all.push(m);
            }
        }
    }
    if options.requests {
        let rows = [
            (
                "requests/planner-run",
                "memory",
                requests::planner_run(options.workers)?,
            ),
            (
                "requests/hostile-planner",
                "none",
                requests::hostile_planner()?,
            ),
        ];
        for (name, journal, sizes) in rows {
            let m = Measurement {
                name: name.into(),
                tasks: if journal == "none" {
                    0
                } else {
                    requests::SPRINTS * requests::TASKS_PER_SPRINT
                },
                journal,
                workers: options.workers,
                requests: Some(sizes.requests),
                largest_request_bytes: Some(sizes.largest_bytes),
                ..Measurement::default()
            };
            printer.requests(&m)?;
            all.push(m);
        }
    }
    if options.memory_runs > 0 {
        for n in 1..=options.memory_runs {
            let config = Throughput {
                tasks: options.tasks,
                shape: Shape::Independent,
                journal: JournalKind::Sqlite,
                workers: options.workers,
            };
            let result = throughput::run(&config).map_err(|source| BenchError::Memory {
                run: n,
                tasks: options.tasks,
                source,
            })?;
            let rss = collected_rss();
            let mut m = Measurement::of_throughput(
                format!("memory/after-run-{n}"),
                options.workers,
                JournalKind::Sqlite,
                &result,
            );
            m.rss_bytes = rss;
            m.rss_above_idle_bytes = rss.zip(idle).map(|(now, idle)| now as i64 - idle as i64);
            printer.memory(&m, idle)?;
            all.push(m);
        }
    }
    Ok(all)
}

/// The resident set after a collection point: the allocator gives back what it can
/// (glibc's `malloc_trim`), then `/proc/self/status` says what is left.
fn collected_rss() -> Option<u64> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory to the system; no pointer is involved.
    unsafe {
        libc::malloc_trim(0);
    }
    throughput::current_rss()
}

/// Prints measurements as they come: JSON lines, or tables with a heading per section.
pub struct Printer<'a> {
    json: bool,
    out: &'a mut dyn Write,
    section: Option<&'static str>,
}

impl<'a> Printer<'a> {
    pub fn new(json: bool, out: &'a mut dyn Write) -> Self {
        Printer {
            json,
            out,
            section: None,
        }
    }

    /// A landing row (`flotilla bench --landing`).
    pub fn landing(&mut self, m: &Measurement) -> Result<(), BenchError> {
        if self.json {
            return self.json_line(m);
        }
        self.heading(
            "landing",
            &format!(
                "Landing: tasks that each write a file, through a daemon, a workspace, a commit \
                 and the merge queue ({} slots{})\n\
                 {:>7} {:>6} {:>10} {:>11} {:>23} {:>18} {:>18} {:>17} {:>16} {:>10} {:>10}",
                m.workers,
                m.gate.as_deref().map_or(String::new(), |g| format!(
                    ", gate `{}`",
                    crate::text_safety::terminal_safe(g)
                )),
                "files",
                "tasks",
                "landed/s",
                "CPU/task",
                "dispatch→landed p50/p99",
                "ready→dispatched",
                "dispatched→started",
                "started→landing",
                "landing→landed",
                "peak RSS",
                "disk"
            ),
        )?;
        let ms = |v: Option<u64>| match v {
            Some(ms) if ms >= 10_000 => format!("{:.1} s", ms as f64 / 1000.0),
            Some(ms) => format!("{ms} ms"),
            None => "-".into(),
        };
        let line = format!(
            "{:>7} {:>6} {:>10.2} {:>11} {:>23} {:>18} {:>18} {:>17} {:>16} {:>10} {:>10}\n",
            m.files.unwrap_or_default(),
            m.tasks,
            m.landed_per_s.unwrap_or_default(),
            format!("{:.1} ms", m.cpu_ms_per_task.unwrap_or_default()),
            format!(
                "{} / {}",
                ms(m.dispatch_landed_p50_ms),
                ms(m.dispatch_landed_p99_ms)
            ),
            ms(m.ready_dispatched_p50_ms),
            ms(m.dispatched_started_p50_ms),
            ms(m.started_landing_p50_ms),
            ms(m.landing_landed_p50_ms),
            mebibytes(m.peak_rss_bytes),
            mebibytes(m.disk_bytes)
        );
        self.emit(&line)
    }

    fn emit(&mut self, text: &str) -> Result<(), BenchError> {
        self.out
            .write_all(text.as_bytes())
            .and_then(|()| self.out.flush())
            .map_err(BenchError::Write)
    }

    fn json_line(&mut self, m: &Measurement) -> Result<(), BenchError> {
        let line = serde_json::to_string(m)?;
        self.emit(&format!("{line}\n"))
    }

    /// The heading of `section`, once, before its first row.
    fn heading(&mut self, section: &'static str, text: &str) -> Result<(), BenchError> {
        if self.section == Some(section) {
            return Ok(());
        }
        let blank = if self.section.is_some() { "\n" } else { "" };
        self.section = Some(section);
        self.emit(&format!("{blank}{text}\n"))
    }

    fn throughput(&mut self, m: &Measurement) -> Result<(), BenchError> {
        if self.json {
            return self.json_line(m);
        }
        self.heading(
            "throughput",
            &format!(
                "Throughput: instant tasks through TaskGraph, Dispatch and the workers ({} slots)\n\
                 {:<24} {:>7} {:>7} {:>10} {:>10} {:>29} {:>9}",
                m.workers,
                "run",
                "tasks",
                "journal",
                "tasks/s",
                "events/s",
                "ready→assigned p50/p99/max",
                "peak RSS"
            ),
        )?;
        let line = format!(
            "{:<24} {:>7} {:>7} {:>10.0} {:>10.0} {:>29} {:>9}\n",
            m.name,
            m.tasks,
            m.journal,
            m.tasks_per_s.unwrap_or_default(),
            m.events_per_s.unwrap_or_default(),
            format!(
                "{} / {} / {}",
                micros(m.dispatch_p50_us),
                micros(m.dispatch_p99_us),
                micros(m.dispatch_max_us)
            ),
            mebibytes(m.peak_rss_bytes)
        );
        self.emit(&line)
    }

    fn scaling(&mut self, m: &Measurement, first: Option<&Measurement>) -> Result<(), BenchError> {
        if self.json {
            return self.json_line(m);
        }
        self.heading(
            "scaling",
            &format!(
                "Scaling: cost per task as the run grows (independent tasks, SQLite)\n\
                 {:>7} {:>12} {:>10} {:>14}",
                "tasks", "µs per task", "tasks/s", "vs the first"
            ),
        )?;
        let per_task = m.per_task_us.unwrap_or_default();
        let ratio = first
            .and_then(|f| f.per_task_us)
            .filter(|f| *f > 0.0)
            .map_or("1.00×".to_string(), |f| format!("{:.2}×", per_task / f));
        let line = format!(
            "{:>7} {:>12.1} {:>10.0} {:>14}\n",
            m.tasks,
            per_task,
            m.tasks_per_s.unwrap_or_default(),
            ratio
        );
        self.emit(&line)
    }

    fn memory(&mut self, m: &Measurement, idle: Option<u64>) -> Result<(), BenchError> {
        if self.json {
            return self.json_line(m);
        }
        self.heading(
            "memory",
            &format!(
                "Memory: runs of {} tasks one after another; resident set after each, after a \
                 collection point
(idle, after a warm-up run of 10 tasks: {})
{:<22} {:>12} {:>14}",
                m.tasks,
                mebibytes(idle),
                "after",
                "resident",
                "above idle"
            ),
        )?;
        let above = m.rss_above_idle_bytes.map_or("-".to_string(), |b| {
            format!("{:+.1} MiB", b as f64 / 1048576.0)
        });
        let line = format!(
            "{:<22} {:>12} {:>14}\n",
            m.name.trim_start_matches("memory/"),
            mebibytes(m.rss_bytes),
            above
        );
        self.emit(&line)
    }

    fn requests(&mut self, m: &Measurement) -> Result<(), BenchError> {
        if self.json {
            return self.json_line(m);
        }
        self.heading(
            "requests",
            &format!(
                "Requests: the root planner's largest request (bytes of its JSON), default budget\n\
                 {:<28} {:>7} {:>9} {:>16}",
                "run", "tasks", "requests", "largest request"
            ),
        )?;
        let line = format!(
            "{:<28} {:>7} {:>9} {:>16}\n",
            m.name.trim_start_matches("requests/"),
            m.tasks,
            m.requests.unwrap_or_default(),
            format!(
                "{:.1} KiB",
                m.largest_request_bytes.unwrap_or_default() as f64 / 1024.0
            )
        );
        self.emit(&line)
    }

    fn makespan(&mut self, m: &Measurement) -> Result<(), BenchError> {
        if self.json {
            return self.json_line(m);
        }
        self.heading(
            "makespan",
            &format!(
                "Makespan on virtual time: seeded random DAGs, log-normal durations\n\
                 {:<28} {:>6} {:>8} {:>14} {:>12} {:>16}",
                "workload", "tasks", "workers", "policy", "makespan", "÷ lower bound"
            ),
        )?;
        let line = format!(
            "{:<28} {:>6} {:>8} {:>14} {:>12} {:>16.3}\n",
            m.name.trim_start_matches("makespan/"),
            m.tasks,
            m.workers,
            m.policy.unwrap_or_default(),
            format!("{:.0} s", m.makespan_secs.unwrap_or_default()),
            m.makespan_over_lower_bound.unwrap_or_default()
        );
        self.emit(&line)
    }
}

fn micros(us: Option<f64>) -> String {
    match us {
        Some(us) if us >= 10_000.0 => format!("{:.0} ms", us / 1000.0),
        Some(us) if us >= 1_000.0 => format!("{:.1} ms", us / 1000.0),
        Some(us) => format!("{us:.0} µs"),
        None => "-".into(),
    }
}

fn mebibytes(bytes: Option<u64>) -> String {
    bytes.map_or("-".into(), |b| {
        format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
    })
}
