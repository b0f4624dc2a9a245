//! Validation of LLM-proposed work: the planner's batches and agents' subplans. Every check
//! here reads only the proposal, its parent and hash lookups, so its cost does not depend on
//! the size of the graph (no whole-graph cycle scan: a proposal's new edges only connect new
//! nodes to each other, or new nodes to existing ones, so a cycle can only lie inside the
//! proposal).
//!
//! The subplan rules and their rejection reasons (letters as in ADR-001 of this project):
//! (a) count, (b) depth, (c) run size, (d) budget, (e) dependency indexes and cycles,
//! (f) scope containment and overlap, (g) path hygiene, (h) duplicates of open tasks,
//! (i) decomposition caps. Rule (j), the deadline, is enforced by a timer after acceptance.
//!
//! Budget sums saturate, and every task is held to the per-task maximum (`max_task_budget`).

use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};

use petgraph::graph::NodeIndex;

use super::{RunGraph, TaskState, ValidBatch, ValidItem};
use crate::config::Limits;
use crate::protocol::ScopePath;
use crate::protocol::{
    Budget, DependencyRef, MAX_TASK_DEPTH, ProposedSubplan, RejectionReason, TaskSpec, Usd,
};

/// A 64-bit hash of a task's identity. A collision would refuse one legitimate task as a
/// duplicate; at 64 bits that is far less likely than any other failure.
pub type Fingerprint = u64;

/// The identity of a task for duplicate detection: its description with case and whitespace
/// folded, plus its sorted scope. Hashed with a fixed-key hasher, so it is the same on replay.
pub fn fingerprint(description: &str, scope: &[ScopePath]) -> Fingerprint {
    let mut fp = description
        .split_whitespace()
        .map(str::to_lowercase)
        .collect::<Vec<_>>()
        .join(" ");
    fp.push('\0');
    let mut paths: Vec<&str> = scope.iter().map(ScopePath::as_str).collect();
    paths.sort_unstable();
    paths.dedup();
    fp.push_str(&paths.join("\n"));
    let mut hasher = std::hash::DefaultHasher::new();
    fp.hash(&mut hasher);
    hasher.finish()
}

fn too_large(subtask: usize, field: &str, size: usize, max: usize) -> Result<(), RejectionReason> {
    if size > max {
        return Err(RejectionReason::PayloadTooLarge {
            subtask,
            field: field.into(),
            size,
            max,
        });
    }
    Ok(())
}

/// Size caps on the free-text fields: LLM output is bounded before anything else looks at it.
fn check_payload(
    limits: &Limits,
    i: usize,
    description: &str,
    acceptance: &str,
    scope_len: usize,
    capabilities: &BTreeSet<String>,
) -> Result<(), RejectionReason> {
    if description.trim().is_empty() {
        return Err(RejectionReason::EmptyDescription { subtask: i });
    }
    too_large(
        i,
        "description",
        description.len(),
        limits.max_description_bytes,
    )?;
    too_large(
        i,
        "acceptance",
        acceptance.len(),
        limits.max_description_bytes,
    )?;
    too_large(i, "scope", scope_len, limits.max_scope_paths)?;
    too_large(
        i,
        "capabilities",
        capabilities.len(),
        limits.max_capabilities,
    )?;
    let longest = capabilities.iter().map(String::len).max().unwrap_or(0);
    too_large(i, "capability name", longest, limits.max_path_bytes)
}

/// Every subtask of a Subplanner batch has acceptance criteria (ADR-032); the first one
/// without is named.
pub(super) fn require_acceptance(plan: &ProposedSubplan) -> Result<(), RejectionReason> {
    match plan
        .subtasks
        .iter()
        .position(|s| s.acceptance.trim().is_empty())
    {
        Some(subtask) => Err(RejectionReason::EmptyAcceptance { subtask }),
        None => Ok(()),
    }
}

/// Rule (d), per item: nothing above `Limits::max_task_budget`, in any dimension.
fn check_task_budget(limits: &Limits, i: usize, asked: Budget) -> Result<(), RejectionReason> {
    if asked.exceeds(&limits.max_task_budget) {
        return Err(RejectionReason::TaskBudgetTooLarge {
            subtask: i,
            asked,
            max: limits.max_task_budget,
        });
    }
    Ok(())
}

/// Rule (g): every path repo-relative and normalized; no empty scope.
fn parse_scope(
    limits: &Limits,
    i: usize,
    raw: &[String],
) -> Result<Vec<ScopePath>, RejectionReason> {
    if raw.is_empty() {
        return Err(RejectionReason::EmptyScope { subtask: i });
    }
    let mut scope = Vec::with_capacity(raw.len());
    for path in raw {
        let parsed = ScopePath::parse(path, limits.max_path_bytes).map_err(|problem| {
            RejectionReason::InvalidPath {
                subtask: i,
                path: path.chars().take(200).collect(),
                problem,
            }
        })?;
        if !scope.contains(&parsed) {
            scope.push(parsed);
        }
    }
    Ok(scope)
}

/// Rule (e): indexes in range and not self-referential.
fn check_indexes(i: usize, deps: &[usize], n: usize) -> Result<(), RejectionReason> {
    for &d in deps {
        if d >= n {
            return Err(RejectionReason::DependencyOutOfRange {
                subtask: i,
                dependency: d,
            });
        }
        if d == i {
            return Err(RejectionReason::SelfDependency { subtask: i });
        }
    }
    Ok(())
}

/// Rule (e): a topological order of the items (Kahn), or the items caught in a cycle.
/// Dependencies may point at later items; only true cycles are refused.
fn topo_order(deps: &[Vec<usize>]) -> Result<Vec<usize>, RejectionReason> {
    let n = deps.len();
    let mut indegree: Vec<usize> = deps.iter().map(Vec::len).collect();
    let mut dependents = vec![Vec::new(); n];
    for (i, ds) in deps.iter().enumerate() {
        for &d in ds {
            dependents[d].push(i);
        }
    }
    let mut order: Vec<usize> = (0..n).filter(|&i| indegree[i] == 0).collect();
    let mut next = 0;
    while next < order.len() {
        for &j in &dependents[order[next]] {
            indegree[j] -= 1;
            if indegree[j] == 0 {
                order.push(j);
            }
        }
        next += 1;
    }
    if order.len() < n {
        let cycle = (0..n).filter(|&i| indegree[i] > 0).collect();
        return Err(RejectionReason::DependencyCycle { cycle });
    }
    Ok(order)
}

fn normalized_spec(spec: TaskSpec, scope: &[ScopePath]) -> TaskSpec {
    TaskSpec {
        scope: scope.iter().map(|p| p.as_str().to_string()).collect(),
        dependencies: Vec::new(),
        ..spec
    }
}

/// Rule (h) for a whole proposal: no item may duplicate an open task or another item.
fn check_duplicates(graph: &RunGraph, fingerprints: &[Fingerprint]) -> Result<(), RejectionReason> {
    let mut seen: HashMap<Fingerprint, usize> = HashMap::new();
    for (i, &fp) in fingerprints.iter().enumerate() {
        if let Some(existing) = graph.open_duplicate(fp) {
            return Err(RejectionReason::DuplicateTask {
                subtask: i,
                existing: existing.to_string(),
            });
        }
        if let Some(first) = seen.insert(fp, i) {
            return Err(RejectionReason::DuplicateTask {
                subtask: i,
                existing: format!("proposed task {first}"),
            });
        }
    }
    Ok(())
}

/// A planner batch of root tasks.
pub(super) fn validate_batch(
    graph: &RunGraph,
    specs: Vec<TaskSpec>,
) -> Result<ValidBatch, RejectionReason> {
    let limits = graph.limits();
    let n = specs.len();
    let would_hold = graph.len().saturating_add(n);
    if would_hold > limits.max_nodes {
        return Err(RejectionReason::NodeLimitExceeded {
            would_hold,
            max: limits.max_nodes,
        });
    }
    let mut scopes = Vec::with_capacity(n);
    let mut batch_deps = Vec::with_capacity(n);
    let mut existing_deps = Vec::with_capacity(n);
    for (i, spec) in specs.iter().enumerate() {
        check_payload(
            limits,
            i,
            &spec.description,
            &spec.acceptance,
            spec.scope.len(),
            &spec.capabilities,
        )?;
        too_large(i, "dependencies", spec.dependencies.len(), limits.max_nodes)?;
        if let Some(asked) = spec.budget {
            check_task_budget(limits, i, asked)?;
        }
        scopes.push(parse_scope(limits, i, &spec.scope)?);
        let mut local = Vec::new();
        let mut existing = Vec::new();
        for dep in &spec.dependencies {
            match dep {
                DependencyRef::Batch(j) => local.push(*j),
                DependencyRef::Task(id) if graph.index_of(id).is_some() => {
                    existing.push(id.clone())
                }
                DependencyRef::Task(id) => {
                    return Err(RejectionReason::UnknownDependency {
                        subtask: i,
                        task: id.to_string(),
                    });
                }
            }
        }
        check_indexes(i, &local, n)?;
        local.sort_unstable();
        local.dedup();
        existing.sort();
        existing.dedup();
        batch_deps.push(local);
        existing_deps.push(existing);
    }
    let order = topo_order(&batch_deps)?;
    let fingerprints: Vec<Fingerprint> = specs
        .iter()
        .zip(&scopes)
        .map(|(s, scope)| super::fingerprint(&s.description, scope))
        .collect();
    check_duplicates(graph, &fingerprints)?;
    let items = specs
        .into_iter()
        .zip(scopes)
        .zip(batch_deps.into_iter().zip(existing_deps))
        .map(|((spec, scope), (batch_deps, existing_deps))| ValidItem {
            budget: spec.budget.unwrap_or(limits.default_budget),
            spec: normalized_spec(spec, &scope),
            batch_deps,
            existing_deps,
        })
        .collect();
    Ok(ValidBatch { items, order })
}

/// What a subplan proposes: a decomposition of a running task, or a further batch of the
/// Subplanner's open decomposition (ADR-008). The same rules apply to both; a further batch
/// is not a new decomposition (the caps of rule (i) do not count it), must not touch what
/// a running sibling holds, and shares what the parent has left after its earlier subtasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Proposal {
    Decompose,
    FurtherBatch,
}

/// A subplan for the task at `parent`. The parent's `spent` already includes what every
/// earlier attempt and the partial work delivered with this proposal consumed.
pub(super) fn validate_subplan(
    graph: &RunGraph,
    parent: NodeIndex,
    plan: &ProposedSubplan,
    proposal: Proposal,
) -> Result<ValidBatch, RejectionReason> {
    let limits = graph.limits();
    let node = graph.node(parent);
    if plan.parent != node.id {
        return Err(RejectionReason::ParentMismatch {
            named: plan.parent.clone(),
            actual: node.id.clone(),
        });
    }
    match proposal {
        Proposal::Decompose => {
            if node.state != TaskState::Running {
                return Err(RejectionReason::ParentNotRunning { state: node.state });
            }
            // (i) decomposition caps.
            if node.proposals_this_attempt >= limits.max_proposals_per_attempt {
                return Err(RejectionReason::AttemptDecompositionCap {
                    max: limits.max_proposals_per_attempt,
                });
            }
            if graph.decompositions() >= limits.max_decompositions_per_run {
                return Err(RejectionReason::RunDecompositionCap {
                    max: limits.max_decompositions_per_run,
                });
            }
        }
        Proposal::FurtherBatch => {
            if node.state != TaskState::WaitingForSubtasks || !node.decomposition_open {
                return Err(RejectionReason::DecompositionNotOpen);
            }
        }
    }
    let n = plan.subtasks.len();
    if n == 0 {
        return Err(RejectionReason::NoSubtasks);
    }
    // (a) count.
    if n > limits.max_subtasks {
        return Err(RejectionReason::TooManySubtasks {
            proposed: n,
            max: limits.max_subtasks,
        });
    }
    // (b) depth, never beyond what a task id can hold (even with unvalidated limits): a
    // deeper id would be journaled but could not be read back.
    let depth = node.id.depth().saturating_add(1);
    let max_depth = limits.max_depth.min(MAX_TASK_DEPTH);
    if depth > max_depth {
        return Err(RejectionReason::DepthExceeded {
            depth,
            max: max_depth,
        });
    }
    // (c) run size.
    let would_hold = graph.len().saturating_add(n);
    if would_hold > limits.max_nodes {
        return Err(RejectionReason::NodeLimitExceeded {
            would_hold,
            max: limits.max_nodes,
        });
    }
    // Size caps, (g) path hygiene and (f) containment in the parent's scope.
    let mut scopes = Vec::with_capacity(n);
    for (i, sub) in plan.subtasks.iter().enumerate() {
        check_payload(
            limits,
            i,
            &sub.description,
            &sub.acceptance,
            sub.scope.len(),
            &sub.capabilities,
        )?;
        too_large(i, "depends_on", sub.depends_on.len(), limits.max_subtasks)?;
        let scope = parse_scope(limits, i, &sub.scope)?;
        if let Some(outside) = scope
            .iter()
            .find(|p| !node.scope.iter().any(|q| q.covers(p)))
        {
            return Err(RejectionReason::ScopeOutsideParent {
                subtask: i,
                path: outside.to_string(),
            });
        }
        scopes.push(scope);
    }
    // (e) dependency indexes and cycles.
    let mut deps = Vec::with_capacity(n);
    for (i, sub) in plan.subtasks.iter().enumerate() {
        check_indexes(i, &sub.depends_on, n)?;
        let mut d = sub.depends_on.clone();
        d.sort_unstable();
        d.dedup();
        deps.push(d);
    }
    let order = topo_order(&deps)?;
    // (f) overlap: allowed only between subtasks ordered by a (transitive) dependency, since
    // only those can never run at the same time.
    let mut before = vec![vec![false; n]; n];
    for &i in &order {
        for &d in &deps[i] {
            before[i][d] = true;
            let inherited = before[d].clone();
            for (mine, theirs) in before[i].iter_mut().zip(inherited) {
                *mine |= theirs;
            }
        }
    }
    for a in 0..n {
        for b in a + 1..n {
            if before[a][b] || before[b][a] {
                continue;
            }
            for p in &scopes[a] {
                if let Some(q) = scopes[b].iter().find(|q| p.overlaps(q)) {
                    let path = if p.covers(q) { q } else { p };
                    return Err(RejectionReason::ScopeOverlap {
                        first: a,
                        second: b,
                        path: path.to_string(),
                    });
                }
            }
        }
    }
    // (f) for a further batch: nothing a running sibling holds. Bounded by the parent's
    // subtasks, which rules (a), (c) and the iteration cap bound.
    let siblings = || {
        node.children
            .iter()
            .map(|&c| graph.node(c))
            .filter(|c| !c.state.is_terminal())
    };
    if proposal == Proposal::FurtherBatch {
        for (i, scope) in scopes.iter().enumerate() {
            for sibling in siblings() {
                if let Some(p) = scope
                    .iter()
                    .find(|p| sibling.scope.iter().any(|q| p.overlaps(q)))
                {
                    return Err(RejectionReason::ScopeOverlapsLiveSubtask {
                        subtask: i,
                        sibling: sibling.id.clone(),
                        path: p.to_string(),
                    });
                }
            }
        }
    }
    // (d) budget: no cap above the per-task maximum; caps sum within what the parent has
    // left after everything its attempts spent (and, for a further batch, after what its
    // earlier subtasks hold: a live one its budget, an ended one what it spent); uncapped
    // subtasks share the rest. Sums saturate: a model's numbers must not wrap into a small
    // "need".
    let mut remaining = node.budget.saturating_sub(node.spent);
    if proposal == Proposal::FurtherBatch {
        for &c in &node.children {
            let child = graph.node(c);
            let held = if child.state.is_terminal() {
                child.spent
            } else {
                child.budget
            };
            remaining = remaining.saturating_sub(Budget {
                wall_time_ms: 0,
                ..held
            });
        }
    }
    let mut capped = Budget::default();
    let mut uncapped = 0u64;
    for (i, sub) in plan.subtasks.iter().enumerate() {
        match sub.budget_cap {
            Some(cap) => {
                check_task_budget(limits, i, cap)?;
                capped.tokens = capped.tokens.saturating_add(cap.tokens);
                capped.cost_usd = capped.cost_usd.saturating_add(cap.cost_usd);
                // Subtasks run side by side, so wall time is bounded per subtask, not summed.
                capped.wall_time_ms = capped.wall_time_ms.max(cap.wall_time_ms);
            }
            None => uncapped = uncapped.saturating_add(1),
        }
    }
    let over = capped.tokens > remaining.tokens
        || capped.cost_usd > remaining.cost_usd
        || capped.wall_time_ms > remaining.wall_time_ms;
    let left = remaining.saturating_sub(Budget {
        wall_time_ms: 0,
        ..capped
    });
    let starved = uncapped > 0 && (left.tokens < uncapped || remaining.wall_time_ms == 0);
    if over || starved {
        let needed = Budget {
            tokens: capped.tokens.saturating_add(uncapped),
            ..capped
        };
        return Err(RejectionReason::BudgetExceeded { needed, remaining });
    }
    let share = Budget {
        tokens: left.tokens / uncapped.max(1),
        cost_usd: Usd::from_micros(left.cost_usd.micros() / uncapped.max(1)),
        wall_time_ms: remaining.wall_time_ms,
    };
    // (h) duplicates of open tasks (the parent included) or of each other.
    let fingerprints: Vec<Fingerprint> = plan
        .subtasks
        .iter()
        .zip(&scopes)
        .map(|(s, scope)| fingerprint(&s.description, scope))
        .collect();
    check_duplicates(graph, &fingerprints)?;

    let items = plan
        .subtasks
        .iter()
        .zip(scopes)
        .zip(deps)
        .map(|((sub, scope), batch_deps)| {
            let spec = TaskSpec {
                description: sub.description.clone(),
                scope: Vec::new(),
                acceptance: sub.acceptance.clone(),
                priority: sub.priority.unwrap_or(node.spec.priority),
                capabilities: sub.capabilities.clone(),
                budget: sub.budget_cap,
                dependencies: Vec::new(),
                expected_outputs: sub.expected_outputs.clone(),
            };
            ValidItem {
                spec: normalized_spec(spec, &scope),
                budget: sub.budget_cap.unwrap_or(share),
                batch_deps,
                existing_deps: Vec::new(),
            }
        })
        .collect();
    Ok(ValidBatch { items, order })
}
