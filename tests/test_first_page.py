"""What a first-time user meets before clicking anything: the rollout the page opens on, the
sidebar's settings that show only where they act, and the policy line."""
from sample_data import CHAT_POLICY_DIR, POLICY_DIR
from studio.queries import lookups
from studio.signals.advantages import ESTIMATORS


def test_the_page_opens_on_a_group_with_right_and_wrong_answers(seeded_store):
    first = lookups.informative_rollout(seeded_store)
    group = seeded_store.df("SELECT correct FROM rollouts WHERE group_id = (SELECT group_id FROM rollouts "
                            "WHERE rollout_id = ?)", [first])["correct"]
    assert group.any() and not group.all()  # its advantages differ: there is something to compare
    assert seeded_store.scalar("SELECT count(*) FROM tokens WHERE rollout_id = ?", [first]) > 0  # a filled strip
    newest_mixed = seeded_store.scalar(
        "SELECT max(created_at) FROM rollouts GROUP BY group_id HAVING bool_or(correct) AND NOT bool_and(correct) "
        "ORDER BY 1 DESC LIMIT 1")
    assert seeded_store.scalar("SELECT created_at FROM rollouts WHERE rollout_id = ?", [first]) == newest_mixed


def test_without_a_mixed_group_the_newest_drawn_rollout_opens(seeded_store, empty_store):
    assert lookups.informative_rollout(empty_store) is None
    with seeded_store.transaction() as cur:
        cur.execute("UPDATE rollouts SET correct = true")  # every group all-equal
    first = lookups.informative_rollout(seeded_store)
    newest = seeded_store.scalar("SELECT max(created_at) FROM rollouts ro WHERE EXISTS "
                                 "(SELECT 1 FROM tokens t WHERE t.rollout_id = ro.rollout_id)")
    assert seeded_store.scalar("SELECT created_at FROM rollouts WHERE rollout_id = ?", [first]) == newest


def test_advantage_settings_show_only_where_they_act(seeded_store):
    from widgets.base.state import StudioState
    from widgets.credit_panel import credit_controls

    state = StudioState(store=seeded_store)
    controls = credit_controls(state)

    def shown() -> set[str]:
        out = set()

        def walk(obj, visible=True):
            visible = visible and obj.visible
            if hasattr(obj, "objects"):
                for child in obj.objects:
                    walk(child, visible)
            elif visible and getattr(obj, "name", ""):
                out.add(obj.name)
        walk(controls)
        return out

    assert shown() >= {"Advantage estimator", "Steps by", "Step rewards under the tokens"}
    hidden = {"β (KL weight)", "γ", "λ", "Critic values (GAE)", "Reference policy (KL, implicit PRM)",
              "Steps → outcome", "Gate τ (G-RA)", "delimiter / regex / tag"}
    assert not shown() & hidden  # GRPO reads none of them
    state.estimator = "kl"
    assert {"β (KL weight)", "Reference policy (KL, implicit PRM)"} <= shown() and "γ" not in shown()
    state.estimator = "gae"
    assert {"γ", "λ", "Critic values (GAE)"} <= shown() and "β (KL weight)" not in shown()
    state.param.update(estimator="grpo", step_source="implicit", segmenter="delimiter")
    assert {"β (KL weight)", "Steps → outcome", "Gate τ (G-RA)", "delimiter / regex / tag"} <= shown()
    assert set(ESTIMATORS) == {"grpo", "dr_grpo", "rloo", "reinforce_pp", "gae", "kl"}  # each case above


def test_the_policy_line_does_not_guess_the_device():
    from studio.face.app import describe_policy

    assert describe_policy(POLICY_DIR) == "sample policy · gpt2"
    assert describe_policy(CHAT_POLICY_DIR) == "sample chat policy · qwen2"
    assert "not a model folder" in describe_policy("/nonexistent/model")


def test_the_backend_line_says_when_a_local_policy_cannot_load(tmp_path):
    """A folder that is not a model, or one whose weights the worker cannot load, is said so at once
    (in red) instead of a "loading…" that never ends."""
    import shutil
    import time

    from studio.workers import processes
    from widgets.generate_panel import backend_html

    assert "not a model folder" in backend_html(str(tmp_path / "nothing-here"), "local")
    broken = tmp_path / "broken-policy"
    broken.mkdir()
    shutil.copy(POLICY_DIR / "config.json", broken / "config.json")  # a config, and no weights
    assert "loading…" in backend_html(str(broken), "local")
    processes.warm(broken)
    deadline = time.time() + 120
    while processes.load_error(broken) is None and time.time() < deadline:
        time.sleep(0.5)
    error = processes.load_error(broken)
    assert error is not None and processes.local_device(broken) is None
    line = backend_html(str(broken), "local", error=error)
    assert "could not load it" in line and "backend-dot bad" in line
