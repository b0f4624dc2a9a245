//! One landing cycle of the MergeQueue, off the actor's thread: adopted work found on main,
//! build on main's tip, gate, bisect a failing batch, journal the intent, compare-and-swap
//! main, report. The steps are numbered in the MergeQueue's doc (`super`); this file knows
//! the ports and the messages it sends, never the actor's queue.

use super::*;

/// Compare-and-swaps that may find main moved by someone else, in a row, before the batch's
/// tasks fail.
const MAX_MAIN_RACES: u32 = 10;
/// Waits for main's lock (held by another writer) in one round before the batch goes back
/// to the queue: about 10 s in all.
const MAX_LOCK_WAITS: u32 = 8;

/// The wait before the `n`-th try after finding main locked: 40 ms doubling, at most 4 s.
fn lock_backoff(n: u32) -> Duration {
    Duration::from_millis(40u64.saturating_mul(1 << n.min(7)).min(4_000))
}

/// One landing cycle's world, moved off the actor.
pub(super) struct Cycle {
    /// The tip main must still contain (the last one flotilla wrote).
    pub(super) written: Option<String>,
    /// Commits an adopted main dropped: never landed again through a branch that holds them.
    pub(super) dropped: Arc<Vec<String>>,
    pub(super) kit: MergeKit,
    pub(super) graph: Recipient<FromMerging>,
    pub(super) intents: Recipient<IntendLanding>,
    pub(super) reconciler: Option<Recipient<ToReconciler>>,
    pub(super) cancel: CancellationToken,
    pub(super) run: RunId,
    /// Told, with the candidate, when main is about to move to it: the queue builds the
    /// next batch on it meanwhile (ADR-041, "the queue pipelined").
    pub(super) committing: Recipient<Committing>,
    /// This cycle's number, said with `committing`.
    pub(super) number: u64,
}

/// A batch built ahead, while the cycle before it moved main to `base`.
pub(super) struct Prebuilt {
    pub(super) base: String,
    /// The branches it was built from, in order: each task and the head it had.
    pub(super) heads: Vec<(TaskId, String)>,
    pub(super) outcome: BuildOutcome,
}

impl Prebuilt {
    /// Built on `tip` from the first of `items` (those that arrived since are built on its
    /// candidate): anything else is built again, never landed on another base.
    fn fits(&self, tip: &str, items: &[Queued]) -> bool {
        self.base == tip
            && self.heads.len() <= items.len()
            && self
                .heads
                .iter()
                .zip(items)
                .all(|((task, head), q)| *task == q.request.task && *head == q.request.head)
    }
}

/// Why a build-and-gate round stopped.
enum Round {
    /// Landed (main moved).
    Landed,
    /// The gate failed with this command's output.
    GateFailed { command: String, tail: String },
    /// The batch must be tried again (main moved, a conflict between batch members).
    Again,
}

impl Cycle {
    /// `prebuilt`: this batch built while the cycle before moved main, used when main's
    /// tip is still what it was built on.
    pub(super) async fn land(self, batch: Vec<Queued>, prebuilt: Option<Prebuilt>) -> CycleEnd {
        let mut end = CycleEnd {
            requeue: Vec::new(),
            landed: Vec::new(),
            failed: 0,
            written: None,
            diverged: None,
            storage: None,
        };
        let batch = self.already_landed(batch, &mut end).await;
        if batch.is_empty() {
            return end;
        }
        // Flaky check: a failing batch is tested once more before anyone is blamed.
        if let Round::GateFailed { command, tail } =
            self.round(&batch, &mut end, true, prebuilt).await
        {
            self.bisect(batch, (command, tail), &mut end).await;
        }
        end
    }

    /// What main already holds is reported, not landed again: a crash after the
    /// compare-and-swap and before `TaskLanded` leaves the work there. The evidence is the
    /// commit journaled ahead of the move (`LandRequest::intended`, ADR-018) found on main's
    /// first-parent history; a commit's trailer text is never evidence (an agent can write
    /// one for any task).
    async fn already_landed(&self, batch: Vec<Queued>, end: &mut CycleEnd) -> Vec<Queued> {
        if batch.iter().all(|q| q.request.intended.is_empty()) {
            return batch;
        }
        let tip = match self.kit.reader.main_tip().await {
            Ok(tip) => tip,
            Err(e) => {
                warn!(run = %self.run, error = %e, "reading main's tip");
                return batch;
            }
        };
        let intended = batch.iter().map(|q| q.request.intended.clone()).collect();
        let found = match self.kit.git.find_on_main(tip, intended).await {
            Ok(found) => found,
            Err(e) => {
                warn!(run = %self.run, error = %e, "looking for landed work on main");
                return batch;
            }
        };
        let mut rest = Vec::new();
        for (queued, commit) in batch.into_iter().zip(found) {
            match commit {
                Some(commit) => {
                    let r = &queued.request;
                    // Branches go before the graph hears, as after a landing: once the task
                    // is landed nothing enqueues it again, so a kill between the two would
                    // leave its branch (and a fixed task's) for good.
                    self.delete_branches(r).await;
                    self.graph.do_send(FromMerging::FoundOnMain {
                        task: r.task.clone(),
                        attempt: r.attempt,
                        commit,
                    });
                    end.landed.push(queued.enqueued.elapsed());
                }
                None => rest.push(queued),
            }
        }
        rest
    }

    /// Bisects a batch whose gate failed (`failure`): halves are built and gated on main's
    /// tip in turn, those that pass land, and a single branch that fails is a culprit and
    /// gets the gate's output. Every branch gets a verdict or goes back to the queue.
    async fn bisect(&self, batch: Vec<Queued>, failure: (String, String), end: &mut CycleEnd) {
        let mut pending = vec![(batch, Some(failure))];
        while let Some((mut items, known)) = pending.pop() {
            let verdict = match known {
                Some((command, tail)) => Round::GateFailed { command, tail },
                None => self.round(&items, end, false, None).await,
            };
            match verdict {
                Round::Landed | Round::Again => {}
                Round::GateFailed { command, tail } if items.len() == 1 => {
                    let r = &items[0].request;
                    self.graph.do_send(FromMerging::Failed {
                        task: r.task.clone(),
                        attempt: r.attempt,
                        failure: LandingFailure::GateFailed {
                            command,
                            output_tail: tail,
                        },
                    });
                    // Its retry may continue from it (ADR-031).
                    if !self.kit.retry_in_place {
                        self.delete_branches_of_attempt(r).await;
                    }
                    end.failed += 1;
                }
                Round::GateFailed { .. } => {
                    let right = items.split_off(items.len() / 2);
                    // Popped last-in first: the left half is tried first.
                    pending.push((right, None));
                    pending.push((items, None));
                }
            }
        }
    }

    /// Builds `items` on main's tip, gates the candidate and moves main to it.
    async fn round(
        &self,
        items: &[Queued],
        end: &mut CycleEnd,
        flaky_retry: bool,
        mut prebuilt: Option<Prebuilt>,
    ) -> Round {
        let mut items = items;
        let mut races = 0;
        let mut lock_waits = 0;
        loop {
            let tip = match self.kit.reader.main_tip().await {
                Ok(tip) => tip,
                Err(e) => {
                    self.fail_all(
                        items,
                        format!("reading {}: {e}", self.kit.config.branch_name()),
                        end,
                    );
                    return Round::Again;
                }
            };
            // main must still hold what flotilla last wrote there. Moved forward (a user's
            // commit, another run's landing): the batch is built on top. Reset, force-pushed
            // or moved aside: landing stops, and nothing dropped is replayed.
            let written = end.written.as_ref().or(self.written.as_ref());
            if let Some(written) = written.filter(|w| **w != tip) {
                match self.kit.git.contains(tip.clone(), written.clone()).await {
                    Ok(true) => {}
                    Ok(false) => {
                        end.requeue.extend(items.iter().cloned());
                        end.diverged = Some(tip);
                        return Round::Again;
                    }
                    Err(e) => {
                        warn!(run = %self.run, error = %e, "checking that main holds what was landed");
                        end.requeue.extend(items.iter().cloned());
                        end.diverged = Some(tip);
                        return Round::Again;
                    }
                }
            }
            // A branch started from main before it was reset holds the work the adoption
            // dropped: landing it would replay that work (ADR-024). Its task is tried again
            // from main as it is; its batch-mates go back to their places in the queue.
            if let Some((index, detail)) = self.holds_dropped_work(items).await {
                for (i, q) in items.iter().enumerate() {
                    if i == index {
                        self.graph.do_send(FromMerging::Failed {
                            task: q.request.task.clone(),
                            attempt: q.request.attempt,
                            failure: LandingFailure::StaleBase {
                                detail: detail.clone(),
                            },
                        });
                        self.delete_branches_of_attempt(&q.request).await;
                        end.failed += 1;
                    } else {
                        end.requeue.push(q.clone());
                    }
                }
                return Round::Again;
            }
            let lands: Vec<LandItem> = items
                .iter()
                .map(|q| land_item(self.run, &q.request))
                .collect();
            let built = match prebuilt.take().filter(|p| p.fits(&tip, items)) {
                Some(ahead) => self.built_on_tip(ahead, lands, &tip).await,
                None => {
                    self.kit
                        .git
                        .build(tip.clone(), lands, self.kit.config.mode)
                        .await
                }
            };
            let (candidate, commits) = match built {
                Ok(BuildOutcome::Built { tip, commits }) => {
                    // Crash point: a candidate exists (commits written, no ref moved) and is
                    // ungated. A restart must build and gate it again, never land it as is.
                    fail::fail_point!("merge::after-build", |_| crash_here("merge::after-build"));
                    (tip, commits)
                }
                Ok(BuildOutcome::Conflict {
                    index,
                    files,
                    clashing,
                    main_moved,
                }) if index > 0 => {
                    // The clash may be with a batch-mate ahead, which is not on main: judged
                    // now, its fix would start from a main without that side (nothing to
                    // resolve, an empty fix, then a second fix for the same conflict). Those
                    // ahead built cleanly and go on alone; the rest go back, to be built on
                    // what they land.
                    debug!(run = %self.run, task = %items[index].request.task, ?files, ?clashing, main_moved, "a conflict inside a batch: the branches ahead of it go on alone");
                    end.requeue.extend(items[index..].iter().cloned());
                    items = &items[..index];
                    continue;
                }
                Ok(BuildOutcome::Conflict {
                    index,
                    files,
                    clashing,
                    main_moved,
                }) => {
                    self.conflict(items, index, files, clashing, main_moved, end);
                    return Round::Again;
                }
                Ok(BuildOutcome::Unusable { index, detail }) => {
                    // Only that branch is at fault (gone, or moved since its handoff): it
                    // fails, and its batch-mates go back to their places in the queue.
                    for (i, q) in items.iter().enumerate() {
                        if i == index {
                            self.fail_one(q, detail.clone(), end);
                        } else {
                            end.requeue.push(q.clone());
                        }
                    }
                    return Round::Again;
                }
                Err(e) => {
                    self.fail_all(items, e.to_string(), end);
                    return Round::Again;
                }
            };
            let gate = match self.gate(&candidate, items).await {
                None => None,
                Some(GateStop::Failed(command, tail)) => Some((command, tail)),
                Some(GateStop::Storage(error)) => return self.storage_refused(items, error, end),
            };
            if let Some((command, tail)) = gate {
                let tasks: Vec<TaskId> = items.iter().map(|q| q.request.task.clone()).collect();
                let retry = flaky_retry;
                self.graph
                    .do_send(FromMerging::Note(Box::new(EventKind::MergeGateFailed {
                        tasks,
                        command: command.clone(),
                        output_tail: tail.clone(),
                        bisecting: !retry && items.len() > 1,
                        flaky_retry: retry,
                    })));
                if retry {
                    // Once more on the same candidate: a flaky gate blames nobody.
                    match self.gate(&candidate, items).await {
                        None => {}
                        Some(GateStop::Failed(command, tail)) => {
                            return Round::GateFailed { command, tail };
                        }
                        Some(GateStop::Storage(error)) => {
                            return self.storage_refused(items, error, end);
                        }
                    }
                } else {
                    return Round::GateFailed { command, tail };
                }
            }
            // Crash point: the candidate passed its gate, main has not moved. The verdict is
            // kept nowhere: a restart gates again before main moves.
            fail::fail_point!("merge::after-gate", |_| crash_here("merge::after-gate"));
            // The next batch may be built on this candidate while main moves to it; it
            // lands only if main is then here (`Prebuilt::fits`), after this cycle's end.
            self.committing.do_send(Committing {
                cycle: self.number,
                base: candidate.clone(),
            });
            // Written ahead: the journal names the commits that will hold each task's work
            // before main moves, so that a restart can tell them on main (ADR-018).
            let intent = IntendLanding {
                from: tip.clone(),
                to: candidate.clone(),
                landed: items
                    .iter()
                    .zip(&commits)
                    .map(|(q, commit)| IntendedLanding {
                        task: q.request.task.clone(),
                        attempt: q.request.attempt,
                        commit: commit.clone(),
                    })
                    .collect(),
            };
            let journaled = match self.intents.send(intent).await {
                Ok(result) => result,
                Err(e) => Err(IntentNotJournaled::Gone(e)),
            };
            if let Err(e) = journaled {
                // Nobody is to blame: main stays, the batch waits for the restart that a
                // journal failure brings.
                warn!(run = %self.run, error = %e, "main does not move: its intent is not journaled");
                end.requeue.extend(items.iter().cloned());
                return Round::Again;
            }
            // The move waits while the user's checkout of main cannot follow (ADR-021).
            let Some(moved) = self.move_main(&tip, &candidate).await else {
                end.requeue.extend(items.iter().cloned());
                return Round::Again; // the queue is stopping
            };
            match moved {
                Ok(()) => {
                    // Crash point: main holds the work, nothing else knows (no checkout sync,
                    // branches still there, no event). A restart must find the intended
                    // commits on main and report them, not land the tasks a second time.
                    fail::fail_point!("merge::after-cas", |_| crash_here("merge::after-cas"));
                    end.written = Some(candidate.clone());
                    self.landed(items, &tip, &candidate, commits, end).await;
                    return Round::Landed;
                }
                Err(MainRefError::Moved { .. }) if races < MAX_MAIN_RACES => {
                    races += 1;
                    continue;
                }
                Err(MainRefError::Busy { detail }) => {
                    // Another writer holds main's lock: contention, never the batch's
                    // fault. Wait (exponentially, bounded) and build again on whatever main
                    // is then; past the bound the batch goes back to the queue unjudged.
                    if lock_waits >= MAX_LOCK_WAITS {
                        warn!(run = %self.run, %detail, "main stayed locked; the batch waits in the queue");
                        end.requeue.extend(items.iter().cloned());
                        return Round::Again;
                    }
                    let wait = lock_backoff(lock_waits);
                    lock_waits += 1;
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = self.cancel.cancelled() => {
                            end.requeue.extend(items.iter().cloned());
                            return Round::Again;
                        }
                    }
                    continue;
                }
                Err(e) => {
                    self.fail_all(
                        items,
                        format!("moving {}: {e}", self.kit.config.branch_name()),
                        end,
                    );
                    return Round::Again;
                }
            }
        }
    }

    /// [`Self::built_on`], used only when its candidate descends from `tip`: whatever went
    /// wrong ahead, a candidate from another history is built again, never landed (the
    /// compare-and-swap checks only main's old value, not ancestry).
    async fn built_on_tip(
        &self,
        ahead: Prebuilt,
        lands: Vec<LandItem>,
        tip: &str,
    ) -> Result<BuildOutcome, RepoError> {
        let again = lands.clone();
        let built = self.built_on(ahead, lands).await?;
        if let BuildOutcome::Built { tip: candidate, .. } = &built {
            let descends = self
                .kit
                .git
                .contains(candidate.clone(), tip.to_string())
                .await;
            if !matches!(descends, Ok(true)) {
                warn!(run = %self.run, %candidate, %tip, ?descends, "a batch built ahead is not on main's tip: built again");
                return self
                    .kit
                    .git
                    .build(tip.to_string(), again, self.kit.config.mode)
                    .await;
            }
        }
        Ok(built)
    }

    /// What was built ahead, with the branches that arrived since (the rest of `lands`)
    /// built on its candidate: as one build of all of them would say, a conflict or an
    /// unusable branch among those numbered in the whole batch (so never first: the ones
    /// ahead of it go on alone).
    async fn built_on(
        &self,
        ahead: Prebuilt,
        mut lands: Vec<LandItem>,
    ) -> Result<BuildOutcome, RepoError> {
        let done = ahead.heads.len();
        let (tip, mut commits) = match ahead.outcome {
            BuildOutcome::Built { tip, commits } if lands.len() > done => (tip, commits),
            BuildOutcome::Built { .. } if lands.len() == done => return Ok(ahead.outcome),
            // Not built cleanly: the whole batch is built again, as without it.
            _ => {
                return self
                    .kit
                    .git
                    .build(ahead.base, lands, self.kit.config.mode)
                    .await;
            }
        };
        let rest = lands.split_off(done);
        Ok(
            match self.kit.git.build(tip, rest, self.kit.config.mode).await? {
                BuildOutcome::Built { tip, commits: more } => {
                    commits.extend(more);
                    BuildOutcome::Built { tip, commits }
                }
                BuildOutcome::Conflict {
                    index,
                    files,
                    clashing,
                    main_moved,
                } => BuildOutcome::Conflict {
                    index: index.saturating_add(done),
                    files,
                    clashing,
                    main_moved,
                },
                BuildOutcome::Unusable { index, detail } => BuildOutcome::Unusable {
                    index: index.saturating_add(done),
                    detail,
                },
            },
        )
    }

    /// The compare-and-swap of main, waiting while the user's checkout of main cannot follow
    /// (ADR-021: their changes in the landing's files, a merge in progress, another git
    /// command at work): nothing moved then, and the gated candidate stays good. `None`
    /// when the queue stops meanwhile.
    async fn move_main(&self, tip: &str, candidate: &str) -> Option<Result<(), MainRefError>> {
        let mut wait = CHECKOUT_WAIT_FIRST;
        loop {
            match self
                .kit
                .main
                .compare_and_swap(tip.to_string(), candidate.to_string())
                .await
            {
                Err(MainRefError::CheckoutBusy { detail }) => {
                    warn!(run = %self.run, %detail, retry_in_s = wait.as_secs(), "landing waits for the user's checkout of main");
                    tokio::select! {
                        _ = self.cancel.cancelled() => return None,
                        _ = tokio::time::sleep(wait) => {}
                    }
                    wait = (wait * 2).min(CHECKOUT_WAIT_MAX);
                }
                other => return Some(other),
            }
        }
    }

    /// Runs the gate on `candidate`: `None` when it passed, else the failing command and
    /// its output's tail, or flotilla's storage refusing the scratch checkout (nobody's
    /// failure). A conflict fix must leave no conflict marker in its files.
    async fn gate(&self, candidate: &str, items: &[Queued]) -> Option<GateStop> {
        let marked: Vec<String> = items
            .iter()
            .filter_map(|q| match &q.request.fix {
                Some(FixOf::Conflict { files, .. }) => Some(files.clone()),
                _ => None,
            })
            .flatten()
            .collect();
        if !marked.is_empty() {
            match self
                .kit
                .git
                .conflict_markers(candidate.to_string(), Some(marked))
                .await
            {
                Ok(hits) if !hits.is_empty() => {
                    let at: Vec<String> = hits
                        .iter()
                        .map(|h| format!("{}:{}", h.path, h.line))
                        .collect();
                    return Some(GateStop::Failed(
                        "conflict marker check".into(),
                        format!("conflict markers remain at {}", at.join(", ")),
                    ));
                }
                Ok(_) => {}
                Err(e) => {
                    return Some(GateStop::Failed(
                        "conflict marker check".into(),
                        e.to_string(),
                    ));
                }
            }
        }
        if self.kit.config.gate.is_empty() {
            return None;
        }
        let scratch = ScratchRun {
            git: self.kit.git.clone(),
            runner: self.kit.runner.clone(),
            timeout: Duration::from_secs(self.kit.config.gate_timeout_secs),
            stop_at_first_failure: true,
            slot: WarmSlot::Gate,
        };
        let commands = self
            .kit
            .config
            .gate
            .iter()
            .map(|line| NamedCommand {
                name: "gate".into(),
                line: line.clone(),
            })
            .collect();
        let label = format!("gate-{}", short(candidate));
        match scratch
            .run(candidate.to_string(), label, commands, self.cancel.clone())
            .await
        {
            Ok(results) => results
                .into_iter()
                .find(|r| !r.passed)
                .map(|r| GateStop::Failed(format!("{} ({})", r.line, r.exit), r.tail())),
            Err(RepoError::Storage(e)) => Some(GateStop::Storage(format!(
                "making the gate's scratch checkout: {e}"
            ))),
            Err(e) => Some(GateStop::Failed(
                "scratch checkout".into(),
                format!("making a scratch checkout: {e}"),
            )),
        }
    }

    async fn landed(
        &self,
        items: &[Queued],
        from: &str,
        to: &str,
        commits: Vec<String>,
        end: &mut CycleEnd,
    ) {
        let checkout = match self
            .kit
            .git
            .sync_checkout(from.to_string(), to.to_string())
            .await
        {
            Ok(sync) => sync,
            Err(e) => {
                warn!(run = %self.run, error = %e, "keeping the user's checkout in step");
                CheckoutSync::NotCheckedOut
            }
        };
        // Branches go before the graph hears: a crash in between is healed by the restart's
        // look for the intended commits on main, which comes before any build. The whole
        // batch's in one step (ADR-041).
        let branches = items
            .iter()
            .flat_map(|q| landed_branches(&q.request))
            .collect();
        for (branch, e) in self.kit.git.delete_branches(branches).await {
            warn!(run = %self.run, %branch, error = %e, "deleting a landed branch");
        }
        for q in items {
            end.landed.push(q.enqueued.elapsed());
        }
        // Crash point: main moved and the branches are gone, the graph has not heard. A
        // restart must take the work from the journaled intent, since the branches cannot.
        fail::fail_point!("merge::before-event", |_| crash_here("merge::before-event"));
        let landed = items
            .iter()
            .zip(commits)
            .map(|(q, commit)| (q.request.task.clone(), q.request.attempt, commit))
            .collect();
        self.graph.do_send(FromMerging::MainMoved {
            from: from.to_string(),
            to: to.to_string(),
            landed,
            checkout,
        });
        if let Some(reconciler) = &self.reconciler {
            reconciler.do_send(ToReconciler::MainMoved {
                tip: to.to_string(),
            });
        }
    }

    /// A conflict at `index` (0 from `round`: a conflict further in a batch lets the
    /// branches ahead land first): one more try later when main moved since the branch
    /// left it and it has not had it; otherwise the TaskGraph decides. The others go back
    /// to their places in the queue.
    fn conflict(
        &self,
        items: &[Queued],
        index: usize,
        files: Vec<String>,
        clashing: Vec<String>,
        main_moved: bool,
        end: &mut CycleEnd,
    ) {
        for (i, q) in items.iter().enumerate() {
            if i != index {
                end.requeue.push(q.clone());
                continue;
            }
            let r = &q.request;
            // In a batch, the clash may be with a branch ahead of it that has not landed.
            let retry = (main_moved || index > 0) && !q.conflict_retried;
            if retry {
                self.graph
                    .do_send(FromMerging::Note(Box::new(EventKind::MergeConflict {
                        task: r.task.clone(),
                        files: files.clone(),
                        clashing: clashing.clone(),
                        retrying: true,
                    })));
                let mut again = q.clone();
                again.conflict_retried = true;
                end.requeue.push(again);
            } else {
                self.graph.do_send(FromMerging::Conflict {
                    task: r.task.clone(),
                    attempt: r.attempt,
                    files: files.clone(),
                    clashing: clashing.clone(),
                });
                end.failed += 1;
            }
        }
    }

    /// The first of `items` whose branch holds a commit an adopted main dropped, and why.
    async fn holds_dropped_work(&self, items: &[Queued]) -> Option<(usize, String)> {
        if self.dropped.is_empty() {
            return None;
        }
        for (index, q) in items.iter().enumerate() {
            for commit in self.dropped.iter() {
                let holds = self
                    .kit
                    .git
                    .contains(q.request.head.clone(), commit.clone())
                    .await
                    .unwrap_or(false);
                if holds {
                    let detail = format!(
                        "its branch was started from main before main was reset, and holds \
                         {}, work the adopted main dropped: landing it would bring that work \
                         back, so it is done again from main as it is",
                        short(commit)
                    );
                    return Some((index, detail));
                }
            }
        }
        None
    }

    /// flotilla's storage refused the gate's scratch checkout: the batch goes back to the
    /// queue unjudged, and the queue waits for the storage (ADR-024).
    fn storage_refused(&self, items: &[Queued], error: String, end: &mut CycleEnd) -> Round {
        end.requeue.extend(items.iter().cloned());
        end.storage = Some(error);
        Round::Again
    }

    fn fail_all(&self, items: &[Queued], detail: String, end: &mut CycleEnd) {
        for q in items {
            self.fail_one(q, detail.clone(), end);
        }
    }

    fn fail_one(&self, q: &Queued, detail: String, end: &mut CycleEnd) {
        self.graph.do_send(FromMerging::Failed {
            task: q.request.task.clone(),
            attempt: q.request.attempt,
            failure: LandingFailure::Git { detail },
        });
        end.failed += 1;
    }

    /// A landed branch goes, and with a conflict fix the branch it fixed.
    async fn delete_branches(&self, request: &LandRequest) {
        for (branch, e) in self.kit.git.delete_branches(landed_branches(request)).await {
            warn!(run = %self.run, %branch, error = %e, "deleting a landed branch");
        }
    }

    async fn delete_branches_of_attempt(&self, request: &LandRequest) {
        if let Err(e) = self.kit.git.delete_branch(request.branch.clone()).await {
            warn!(run = %self.run, branch = %request.branch, error = %e, "deleting a branch");
        }
    }
}

/// The branches that go once `request` landed: its own, and with a conflict fix the
/// branch it fixed.
fn landed_branches(request: &LandRequest) -> Vec<String> {
    let mut branches = vec![request.branch.clone()];
    if let Some(FixOf::Conflict { branch, .. }) = &request.fix {
        branches.push(branch.clone());
    }
    branches
}

/// Why a gate did not pass.
enum GateStop {
    /// This command failed, with its output's tail.
    Failed(String, String),
    /// flotilla's storage refused the scratch checkout: nobody's failure.
    Storage(String),
}

/// How long a landing first waits for a user's checkout of main that cannot follow, and at
/// most (doubling in between).
const CHECKOUT_WAIT_FIRST: Duration = Duration::from_secs(1);
const CHECKOUT_WAIT_MAX: Duration = Duration::from_secs(30);

pub(super) fn land_item(run: RunId, request: &LandRequest) -> LandItem {
    LandItem {
        task: request.task.clone(),
        branch: request.branch.clone(),
        head: request.head.clone(),
        subject: request.subject.clone(),
        trailer: trailer(run, request),
        squash: matches!(request.fix, Some(FixOf::Conflict { .. })),
    }
}

fn short(commit: &str) -> &str {
    commit.get(..7).unwrap_or(commit)
}
