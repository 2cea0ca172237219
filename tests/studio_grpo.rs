//! Issue 35 in the studio, driven with egui_kittest on tiny-llama, headless: GRPO picked on the LoRA settings page
//! shows its fields and reward editor; a bad value is refused inline in the engine's words and keeps Start
//! disabled; rewards are added, changed (a program's command line split as a shell would) and removed, and what
//! the editor holds is what the started run records in run.json; Step/Eval/Samples events with GRPO metrics draw
//! the reward, KL, length and clip plots, the status line and the sampled-completions panel, and the same events
//! read back from metrics.jsonl give the same series.

#![cfg(feature = "studio")]

mod common;

use common::fixture;
use common::studio::{app, app_mut, build, click, goto, step_until, StudioHarness};
use egui::accesskit::Role;
use egui_kittest::kittest::{By, NodeT, Queryable};
use metal_candle::engine::device::DeviceChoice;
use metal_candle::engine::train::grpo::{GrpoLoss, GrpoMetrics, GrpoSample, GrpoSettings, RewardKind, RewardSpec};
use metal_candle::engine::train::run_folder::{append_metric, read_metrics};
use metal_candle::engine::train::{Method, TrainConfig, TrainEvent};
use metal_candle::studio::app::{Page, Prefs, StudioOptions};
use metal_candle::studio::live_run::LiveRun;
use metal_candle::studio::run_history::RunHistory;
use metal_candle::studio::settings_panel::ready_config;
use metal_candle::studio::training_panel::RunStatus;
use std::path::Path;

fn prefs(runs: &Path) -> Prefs {
    let mut prefs = Prefs { device: DeviceChoice::Cpu, auto_load_model: false, ..Prefs::default() };
    prefs.model_path = fixture("tiny-llama").display().to_string();
    prefs.train.out = runs.to_path_buf();
    prefs.train.seq_len = 64;
    prefs
}

fn studio(prefs: Prefs, height: f32) -> StudioHarness {
    let options = StudioOptions { discover_defaults: false, persist: false, ..Default::default() };
    let mut h = build(prefs, options, height, true);
    h.step();
    h
}

fn has(h: &StudioHarness, text: &str) -> bool {
    h.query_all_by_label_contains(text).next().is_some()
}

/// The kind dropdown of the `i`th reward.
fn kind_box(h: &StudioHarness, i: usize) -> egui_kittest::Node<'_> {
    h.query_all(By::new().label("kind").role(Role::ComboBox)).nth(i).expect("a reward's kind dropdown")
}

/// Focus the text field labelled `label` and type `text` at its end.
fn type_into(h: &mut StudioHarness, label: &str, text: &str) {
    h.get_by_label(label).focus();
    h.step();
    h.get_by_label(label).type_text(text);
    settle(h);
}

fn settle(h: &mut StudioHarness) {
    h.step();
    h.step();
}

#[test]
fn grpo_settings_and_rewards_are_edited_checked_and_sent_with_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let mut p = prefs(&runs);
    (p.train.iters, p.train.batch_size, p.train.val_every, p.train.save_every) = (Some(1), 1, 0, 0);
    p.train.run_name = Some("grpo-run".into());
    let mut h = studio(p, 2400.0);
    h.get_by_label("Load model").click();
    step_until(&mut h, "the model", 60, |a| a.model.loaded.is_some());
    goto(&mut h, Page::Dataset);
    // Prompts with answers, as GRPO trains on them.
    let data = dir.path().join("prompts");
    std::fs::create_dir_all(&data).unwrap();
    let rows: Vec<String> =
        (1..=8).map(|i| format!(r#"{{"prompt": "What is {i} + {i}?", "answer": "{}"}}"#, 2 * i)).collect();
    std::fs::write(data.join("train.jsonl"), rows.join("\n") + "\n").unwrap();
    app_mut(&mut h).prefs.dataset_input = data.display().to_string();
    h.step();
    h.get_by_label("Open dataset").click();
    step_until(&mut h, "the dataset report", 60, |a| {
        !a.dataset_panel.is_inspecting() && a.dataset_panel.report.is_some()
    });

    goto(&mut h, Page::Settings);
    assert!(!has(&h, "Completions per prompt"), "no GRPO fields for SFT");
    click(&mut h, "GRPO");
    assert_eq!(app(&h).prefs.train.method, Method::Grpo);
    for label in [
        "Completions per prompt",
        "Max new tokens",
        "temperature",
        "top-p",
        "top-k",
        "Iterations",
        "KL beta",
        "Clip epsilon",
        "dr_grpo",
        "Reward scaling",
        "Show samples every",
        "Rewards",
        "Add reward",
        "exact_answer",
        "reinforce the better ones",
    ] {
        assert!(has(&h, label), "{label} is shown for GRPO");
    }

    // One completion per prompt leaves nothing to compare: refused inline and at Start, in the engine's words.
    app_mut(&mut h).prefs.train.grpo.num_generations = 1;
    settle(&mut h);
    assert!(has(&h, "num_generations (--num-generations) is 1; it must be 2 to 256"));
    goto(&mut h, Page::Training);
    assert!(h.get_by_label("Start training").accesskit_node().is_disabled(), "Start waits for a valid value");
    goto(&mut h, Page::Settings);
    app_mut(&mut h).prefs.train.grpo.num_generations = 2;
    (app_mut(&mut h).prefs.train.grpo.max_new_tokens, app_mut(&mut h).prefs.train.grpo.sample_every) = (6, 1);
    click(&mut h, "bnpo");
    click(&mut h, "high");
    assert_eq!(app(&h).prefs.train.grpo.epsilon_high, Some(0.28), "clip-higher starts at DAPO's 0.28");
    assert!(!has(&h, "it must be"), "no refusal once the values are good");

    // Two more rewards: the second becomes a program whose command line is split as a shell would.
    click(&mut h, "Add reward");
    click(&mut h, "Add reward");
    assert_eq!(app(&h).prefs.train.grpo.rewards.len(), 3);
    assert!(has(&h, "exact_answer_3"), "a kind's repeats are numbered as the metrics name them");
    kind_box(&h, 1).click();
    settle(&mut h);
    click(&mut h, "program");
    assert!(matches!(app(&h).prefs.train.grpo.rewards[1].kind, RewardKind::Program { .. }));
    assert!(has(&h, "the program reward has no command"), "a program without a command is refused");
    type_into(&mut h, "command", "sh -c 'read line; echo 1' \"two words\"");
    let RewardKind::Program { command, timeout_secs } = &app(&h).prefs.train.grpo.rewards[1].kind else { panic!() };
    assert_eq!(command, &["sh", "-c", "read line; echo 1", "two words"]);
    assert_eq!(*timeout_secs, 10.0);
    // An open quote does not split: the row says so and the program has no command until it is closed.
    type_into(&mut h, "command", " 'open");
    assert!(has(&h, "the command line does not split into arguments"));
    for _ in 0..6 {
        h.key_press(egui::Key::Backspace);
        h.step();
    }
    settle(&mut h);
    assert!(!has(&h, "does not split"));
    // The first reward goes; the third becomes a format reward with its preset.
    h.query_all_by_label("Remove").next().expect("the first reward's remove button").click();
    settle(&mut h);
    kind_box(&h, 1).click();
    settle(&mut h);
    click(&mut h, "format");
    let rewards = app(&h).prefs.train.grpo.rewards.clone();
    let program = RewardKind::Program {
        command: vec!["sh".into(), "-c".into(), "read line; echo 1".into(), "two words".into()],
        timeout_secs: 10.0,
    };
    assert_eq!(
        rewards,
        [
            RewardSpec { kind: program, weight: 1.0 },
            RewardSpec { kind: RewardKind::Format { structure: "think-answer".into() }, weight: 1.0 },
        ]
    );
    assert!(has(&h, "Ready to train with these settings"), "the page is ready");

    // Start sends exactly these settings (`ready_config` is what the Start button runs).
    let a = app(&h);
    let sent = ready_config(&a.prefs, a.model.loaded.as_ref(), a.prefs.dataset.as_ref()).unwrap();
    assert_eq!((sent.method, &sent.grpo), (Method::Grpo, &a.prefs.train.grpo));
    assert_eq!((sent.grpo.loss, sent.grpo.epsilon_high, sent.grpo.num_generations), (GrpoLoss::Bnpo, Some(0.28), 2));
    goto(&mut h, Page::Training);
    assert!(has(&h, "method grpo · 2 per prompt · bnpo"));
    click(&mut h, "Start training");
    step_until(&mut h, "the GRPO run to end", 240, |a| !a.training_panel.is_active());
    let status = &app(&h).training_panel.status;
    assert_eq!(status, &RunStatus::Finished { stopped_early: false });
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(runs.join("grpo-run/run.json")).unwrap()).unwrap();
    assert_eq!(manifest["config"]["method"].as_str(), Some("grpo"));
    let recorded: GrpoSettings = serde_json::from_value(manifest["config"]["grpo"].clone()).unwrap();
    assert_eq!(recorded, sent.grpo, "run.json holds the editor's settings");
    let run = app(&h).training_panel.run.clone().unwrap();
    assert!(!run.grpo.reward.is_empty() && !run.grpo.samples.is_empty(), "the run's rewards and samples");
}

fn metrics(step: usize) -> GrpoMetrics {
    let reward = step as f64 / 4.0;
    let mut m = GrpoMetrics {
        reward_mean: reward,
        reward_std: 0.25,
        kl: Some(0.01 * step as f64),
        mean_length: 20.0 + step as f64,
        clipped_ratio: 0.25,
        clip_region: 0.05,
        generation_secs: if step % 2 == 1 { 3.0 } else { 0.0 },
        training_secs: 1.0,
        ..Default::default()
    };
    for (name, value) in [("exact_answer", reward), ("format", 1.0 - reward)] {
        m.rewards.insert(format!("rewards/{name}/mean"), value);
        m.rewards.insert(format!("rewards/{name}/std"), 0.5);
    }
    m
}

fn sample(completion: &str, finished: bool, advantage: f64) -> GrpoSample {
    GrpoSample {
        prompt: "What is 6 x 7?".into(),
        completion: completion.into(),
        answer: Some("42".into()),
        reward: 1.0,
        rewards: vec![("exact_answer".into(), 1.0), ("format".into(), 0.0)],
        advantage,
        tokens: 12,
        finished,
    }
}

/// A four-step GRPO run's events: steps with metrics, samples at steps 2 and 4, an evaluation at step 4.
fn events(run_dir: &Path) -> Vec<TrainEvent> {
    let mut grpo = GrpoSettings { num_generations: 8, beta: 0.04, ..Default::default() };
    grpo.rewards.push(RewardSpec { kind: RewardKind::Format { structure: "think-answer".into() }, weight: 0.5 });
    let config = TrainConfig { method: Method::Grpo, grpo, ..TrainConfig::default() };
    let mut out = vec![TrainEvent::Started {
        run_dir: run_dir.to_path_buf(),
        config: Box::new(config),
        trainable_params: 1000,
        total_steps: 4,
        tokens_per_epoch: 100,
        target_tokens_per_epoch: 40,
        train_examples: 8,
        valid_examples: 4,
        truncated_examples: 0,
        start_step: 0,
        notes: vec![],
    }];
    for step in 1..=4 {
        out.push(TrainEvent::Step {
            step,
            total_steps: 4,
            loss: 0.01,
            lr: 1e-4,
            grad_norm: 1.0,
            tokens_per_sec: 50.0,
            trained_tokens: step * 20,
            elapsed_secs: step as f64,
            eta_secs: (4 - step) as f64,
            preference: None,
            grpo: Some(Box::new(metrics(step))),
        });
        if step % 2 == 0 {
            let text = format!("<think>step {step} thinks</think><answer>42</answer>");
            let samples = vec![sample(&text, true, 0.5), sample("cut off mid", false, -0.5)];
            out.push(TrainEvent::Samples { step, samples });
        }
    }
    out.push(TrainEvent::Eval {
        step: 4,
        val_loss: -0.6,
        perplexity: 0.0,
        best: true,
        preference: None,
        grpo: Some(Box::new(GrpoMetrics { reward_mean: 0.6, ..Default::default() })),
    });
    out
}

#[test]
fn grpo_events_draw_the_reward_plots_the_status_line_and_the_sampled_completions() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = studio(prefs(dir.path()), 2400.0);
    goto(&mut h, Page::Training);
    assert!(!has(&h, "Sampled completions") && !has(&h, "completions/mean_length"), "nothing before a GRPO run");
    let run_dir = dir.path().join("grpo-run");
    for event in events(&run_dir) {
        app_mut(&mut h).training_panel.on_event(event, 0.6);
    }
    settle(&mut h);
    for label in [
        "reward (mean ± std)",
        "rewards/<name>/mean",
        "kl",
        "completions/mean_length",
        "clip_ratio/region_mean · completions/clipped_ratio",
        "method grpo · 8 per prompt · dapo · beta 0.04",
        "reward 1.000 ± 0.250",
        "exact_answer 1.000 · format 0.000",
        "generation 3.0 s · training 1.0 s",
        "eval_reward 0.600",
        "Sampled completions",
        "step 2",
        "step 4",
        "What is 6 x 7?",
        "<think>step 4 thinks</think><answer>42</answer>",
        "answer 42",
        "advantage +0.500",
        "advantage -0.500",
        "12 tokens",
        "hit the length cap",
    ] {
        assert!(has(&h, label), "{label} is shown");
    }
    let run = app(&h).training_panel.run.clone().unwrap();
    assert_eq!((run.grpo.reward.len(), run.grpo.kl.len(), run.grpo.each_reward.len()), (4, 4, 2));
    // An earlier step's samples, picked by step.
    click(&mut h, "step 2");
    assert!(has(&h, "<think>step 2 thinks</think>") && !has(&h, "<think>step 4 thinks</think>"));

    // The same events read back from metrics.jsonl (a past run) give the same series and samples.
    std::fs::create_dir_all(&run_dir).unwrap();
    for event in events(&run_dir) {
        append_metric(&run_dir, &event).unwrap();
    }
    let replayed = LiveRun::from_history(run_dir.clone(), RunHistory::from_events(read_metrics(&run_dir), None));
    let mut live = run.grpo.clone();
    live.shown_step = None;
    assert_eq!(replayed.grpo, live);
    assert_eq!(replayed.method.as_deref(), Some("grpo · 8 per prompt · dapo · beta 0.04"));
}
