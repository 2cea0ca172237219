//! Interrupted runs in the studio, driven headless with egui_kittest on the tiny Llama fixture: closing the
//! window mid-run asks (keep training, or stop, save and close); after a training process was killed, the
//! training page offers to resume it with its recorded plots; and a resumed run's plots show the whole run,
//! not only the steps since the resume.

#![cfg(feature = "studio")]

mod common;

use common::cli::{sample_data, train_command, Running};
use common::studio::{app, app_mut, click, step_until, StudioHarness};
use egui::{ViewportCommand, ViewportEvent, ViewportId};
use egui_kittest::kittest::Queryable;
use metal_candle::engine::device::DeviceChoice;
use metal_candle::studio::app::{studio_train_defaults, CloseGuard, Page, Prefs, StudioOptions};
use metal_candle::studio::training_panel::RunStatus;
use std::path::Path;

fn prefs(runs: &Path, iters: usize) -> Prefs {
    let mut prefs = Prefs { device: DeviceChoice::Cpu, auto_load_model: false, ..Prefs::default() };
    prefs.model_path = common::fixture("tiny-llama").display().to_string();
    prefs.train = studio_train_defaults();
    prefs.train.out = runs.to_path_buf();
    prefs.train.iters = Some(iters);
    prefs.train.batch_size = 2;
    prefs.train.seq_len = 64;
    prefs.train.warmup = Some(1);
    prefs.train.save_every = 2;
    prefs
}

fn harness(prefs: Prefs) -> StudioHarness {
    let options = StudioOptions { discover_defaults: false, persist: false, ..Default::default() };
    common::studio::build(prefs, options, 860.0, false)
}

/// The window's close button, as the platform reports it.
fn press_window_close(h: &mut StudioHarness) {
    h.input_mut().viewports.entry(ViewportId::ROOT).or_default().events.push(ViewportEvent::Close);
    h.step();
}

fn sent(h: &StudioHarness, wanted: &ViewportCommand) -> bool {
    h.output().viewport_output.get(&ViewportId::ROOT).is_some_and(|v| v.commands.contains(wanted))
}

fn load_model_and_data(h: &mut StudioHarness) {
    click(h, Page::Model.title());
    click(h, "Load model");
    step_until(h, "the model to load", 60, |a| a.model.loaded.is_some() || a.model.error.is_some());
    click(h, Page::Dataset.title());
    app_mut(h).prefs.dataset_input = sample_data().display().to_string();
    click(h, "Open dataset");
    step_until(h, "the dataset report", 60, |a| a.dataset_panel.report.as_ref().is_some_and(|r| r.tokens.is_some()));
}

#[test]
fn closing_mid_run_asks_and_then_stops_saves_and_closes() {
    let tmp = tempfile::tempdir().unwrap();
    let mut h = harness(prefs(&tmp.path().join("runs"), 100_000));
    load_model_and_data(&mut h);
    click(&mut h, Page::Training.title());
    click(&mut h, "Start training");
    step_until(&mut h, "steps", 120, |a| a.training_panel.run.as_ref().is_some_and(|r| r.step >= 2));

    // The close is cancelled and the question shown; "Keep training" keeps the run going.
    press_window_close(&mut h);
    assert!(sent(&h, &ViewportCommand::CancelClose), "a close mid-run is held back");
    h.step();
    assert!(h.query_by_label("A training run is still going").is_some());
    assert_eq!(app(&h).close_guard, CloseGuard::Asking);
    click(&mut h, "Keep training");
    assert_eq!(app(&h).close_guard, CloseGuard::Idle);
    assert_eq!(app(&h).training_panel.status, RunStatus::Running);
    let step = app(&h).training_panel.run.as_ref().unwrap().step;
    step_until(&mut h, "more steps", 60, |a| a.training_panel.run.as_ref().is_some_and(|r| r.step > step));

    // "Stop, save and close": the run stops with a final checkpoint, then the window closes by itself.
    press_window_close(&mut h);
    h.step();
    click(&mut h, "Stop, save and close");
    assert_eq!(app(&h).close_guard, CloseGuard::ClosingAfterStop);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !sent(&h, &ViewportCommand::Close) {
        assert!(std::time::Instant::now() < deadline, "the window did not close after the stop");
        h.step();
    }
    let t = &app(&h).training_panel;
    assert_eq!(t.status, RunStatus::Finished { stopped_early: true });
    let run = t.run.as_ref().unwrap();
    assert!(run.checkpoints.iter().any(|(s, _)| *s == run.step), "a final checkpoint at the stop step");
}

#[test]
fn a_killed_run_is_offered_for_resume_and_its_plots_cover_the_whole_run() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("runs");
    // A training process killed without warning after its second checkpoint (steps 2 and 4).
    let mut command = train_command(&runs, "killed");
    command.args(["--json", "--iters", "100000", "--save-every", "2"]);
    let child = Running::spawn(command);
    child.wait_for("checkpoint_saved", |e| e["step"] == 4).expect("the run reached step 4");
    child.signal("KILL");
    child.finish();

    let mut h = harness(prefs(&runs, 6));
    click(&mut h, Page::Training.title());
    step_until(&mut h, "the resume offer with the run's plots", 60, |a| {
        a.training_panel.offer.is_some() && a.training_panel.run.as_ref().is_some_and(|r| !r.loss.is_empty())
    });
    h.step();
    let offer = app(&h).training_panel.offer.clone().unwrap();
    assert_eq!(offer.run_name, "killed");
    let (checkpoint, checkpoint_step) = offer.checkpoint.clone().expect("the run saved checkpoints");
    assert!(checkpoint_step >= 4 && offer.reached_step >= checkpoint_step, "{offer:?}");
    let recorded = app(&h).training_panel.run.as_ref().unwrap().loss.len();
    assert!(recorded >= 4, "the interrupted run's recorded steps are plotted");
    assert!(h.query_by_label("The last run, killed, did not finish").is_some());
    assert!(h
        .query_by_label("No run yet. Load a model, open a dataset, check the LoRA settings, then press Start training.")
        .is_none());

    // Resume: the run's model, dataset and settings come back; it continues for two more steps.
    click(&mut h, &format!("Resume from step {checkpoint_step}"));
    assert_eq!(app(&h).prefs.train.resume.as_ref(), Some(&checkpoint));
    step_until(&mut h, "the run's model and dataset", 60, |a| {
        a.model.loaded.is_some() && a.dataset_panel.report.as_ref().is_some_and(|r| r.tokens.is_some())
    });
    let total = checkpoint_step + 2;
    app_mut(&mut h).prefs.train.iters = Some(total);
    h.step();
    click(&mut h, "Resume training");
    step_until(&mut h, "the resumed run to finish", 120, |a| {
        matches!(a.training_panel.status, RunStatus::Finished { .. } | RunStatus::Failed(_))
    });
    step_until(&mut h, "the steps before the resume in the plots", 30, |a| {
        a.training_panel.run.as_ref().is_some_and(|r| r.loss.first().is_some_and(|p| p.x == 1.0))
    });
    let t = &app(&h).training_panel;
    assert_eq!(t.status, RunStatus::Finished { stopped_early: false }, "log: {:?}", t.log);
    let steps: Vec<f64> = t.run.as_ref().unwrap().loss.iter().map(|p| p.x).collect();
    let expected: Vec<f64> = (1..=total).map(|s| s as f64).collect();
    assert_eq!(steps, expected, "one point per step from 1 to the end, none twice");
    assert!(t.offer.is_none(), "the offer is gone once the run resumed");
}
