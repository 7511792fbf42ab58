"""Self-play leagues (training.league.self_play): pools of snapshots that act as the
policies they froze, matchups and draws as configured, learners trained on their own
replicas only, static rollouts, exact resumes, and one-line refusals."""
import pytest
import torch

from gpusim.envs import env_class
from gpusim.errors import GpusimError
from gpusim.training.league.opponents import Pool
from gpusim.training.league.self_play import Matchups
from gpusim.training.loop import Trainer
from gpusim.training.run_config import load_run_config

TAG = {"env.num_taggers": 2, "env.num_runners": 3, "env.num_other_agents_observed": 3,
       "env.episode_length": 12}


def league_trainer(env="tag_continuous", **overrides):
    cls = env_class(env)
    base = TAG if env == "tag_continuous" else {}
    config = load_run_config(env, cls, overrides={
        "trainer.backend": "cpu", "trainer.num_envs": 8, "trainer.rollout_len": 16,
        "trainer.total_steps": 10**6, "trainer.target_return": None, "trainer.compile": "off",
        "trainer.torch_threads": 1, "trainer.league": True, "trainer.league_snapshot_every": 1,
        **base, **overrides})
    return Trainer(config, cls)


def test_a_snapshot_acts_as_the_policy_it_froze():
    """A pool's slot acts (log-probabilities of discrete choices, a Gaussian's mean) as
    the network it copied, and stays as it was while the learner moves on."""
    for env, extra in (("tag_continuous", {}), ("tag_continuous", {"env.continuous_actions": True})):
        trainer = league_trainer(env, **extra)
        algorithm = trainer.algorithm
        trainer.iterate(1e-3)  # one update: slot 1 holds the updated networks
        frozen = {}
        assert [p.name for p in algorithm.policies] == ["tagger", "runner"]
        for p in algorithm.policies:
            assert p.spec.continuous == bool(extra)  # each kind of head, as configured
            pool = algorithm.league.pools[p.name]
            assert pool.filled.tolist()[:2] == [True, True] and pool.born[:2] == [0, 1]
            obs = torch.randn(5, p.spec.num_agents, p.spec.obs_dim)
            slots = torch.ones(5, dtype=torch.long)
            if p.spec.continuous:
                mine = p.model.sample(obs, deterministic=True)
                theirs = pool.act("sample", slots, obs, True)
            else:
                mine = (p.model.log_probs(obs),)
                theirs = (pool.act("log_probs", slots, obs, None),)
            compared = 0
            for a, b in zip(mine, theirs, strict=True):
                assert (a is None) == (b is None)
                if a is not None:
                    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
                    compared += 1
            assert compared >= 1 + 2 * p.spec.continuous  # log-probs; or action, log-prob, squashed
            frozen[p.name] = {k: t[1].clone() for k, t in pool.nets.stacked()[0].items()}
        trainer.iterate(1e-3)
        trainer.iterate(1e-3)  # (slot 1 is not the newest: it was not overwritten)
        assert set(frozen) == {"tagger", "runner"}
        for name, before in frozen.items():  # every policy's pool, every parameter
            now = algorithm.league.pools[name].nets.stacked()[0]
            assert before and before.keys() == now.keys()
            assert all(torch.equal(before[k], now[k][1]) for k in before)


def test_matchups_split_the_replicas_as_configured():
    m = Matchups(["tagger", "runner"], 10, 0.4, "cpu")
    # groups: tagger learns (3), every policy learns (4), runner learns (3)
    assert m.learner_ids("tagger") == list(range(0, 7))
    assert m.frozen_ids("tagger") == list(range(7, 10))
    assert m.learner_ids("runner") == list(range(3, 10))
    assert m.frozen_ids("runner") == list(range(0, 3))
    assert m.group.tolist() == [0] * 3 + [-1] * 4 + [1] * 3
    three = Matchups(["a", "b", "c"], 9, 1 / 3, "cpu")
    assert [len(three.frozen_ids(n)) for n in "abc"] == [4, 4, 4]
    assert all(set(three.learner_ids(n)) | set(three.frozen_ids(n)) == set(range(9))
               for n in "abc")
    with pytest.raises(GpusimError, match="at least 3"):
        Matchups(["tagger", "runner"], 2, 0.5, "cpu")


def test_opponents_are_drawn_as_configured():
    """uniform: every filled slot alike; latest: by recency rank; pfsp: the snapshots the
    learners beat least, most; an empty slot never."""
    model = torch.nn.Linear(2, 2)
    pool = Pool(model, 4, "cpu")
    for update in (0, 5, 9):
        pool.add(model, update, "oldest")
    assert pool.weights("uniform").tolist() == [1.0, 1.0, 1.0, 0.0]
    latest = pool.weights("latest").tolist()
    assert latest[3] == 0.0 and latest[0] < latest[1] < latest[2]
    pool.games.copy_(torch.tensor([10.0, 10.0, 10.0, 0.0]))
    pool.wins.copy_(torch.tensor([9.0, 5.0, 1.0, 0.0]))
    pfsp = pool.weights("pfsp")
    assert pfsp[3] == 0.0 and pfsp[0] < pfsp[1] < pfsp[2]
    generator = torch.manual_seed(0)
    drawn = torch.multinomial(pool.weights("uniform"), 30_000, replacement=True, generator=generator)
    counts = torch.bincount(drawn, minlength=4).float() / 30_000
    assert counts[3] == 0 and torch.allclose(counts[:3], torch.full((3,), 1 / 3), atol=0.02)
    # a full pool evicts its oldest, or its weakest (the learners' best win rate)
    pool.add(model, 12, "oldest")
    assert pool.born == [0, 5, 9, 12]
    assert pool.add(model, 13, "oldest") == 0 and pool.born[0] == 13
    pool.games.copy_(torch.tensor([10.0, 10.0, 10.0, 10.0]))
    pool.wins.copy_(torch.tensor([1.0, 9.0, 2.0, 3.0]))
    assert pool.add(model, 14, "lowest") == 1


def test_each_policy_trains_only_on_the_replicas_where_it_learns():
    trainer = league_trainer()
    algorithm = trainer.algorithm
    algorithm.collect(0)
    envs, agents = algorithm.env.num_envs, None
    for p in algorithm.policies:
        units = algorithm.rows(p).units
        agents = p.spec.num_agents
        replicas = (units // agents) % envs
        learns = set(algorithm.league.trains_on(p.name))
        assert set(replicas.tolist()) == learns and len(learns) < envs
    # the frozen replicas' agents act as the drawn snapshots: their returns are not the
    # learner's (only its own replicas' episodes count)
    counted = algorithm.episodes.counted
    assert set(counted) == {"tagger", "runner"}
    assert counted["runner"].tolist() == [r in algorithm.league.trains_on("runner")
                                          for r in range(envs)]


def test_a_resumed_league_continues_exactly():
    whole = league_trainer()
    stats = [whole.iterate(1e-3) for _ in range(4)]
    part = league_trainer()
    for _ in range(2):
        part.iterate(1e-3)
    part.iteration = 2
    state = part.state_dict()
    again = league_trainer()
    again.load_state_dict(state)
    resumed = [again.iterate(1e-3) for _ in range(2)]
    assert resumed == stats[2:]
    for name, pool in whole.algorithm.league.pools.items():
        theirs = again.algorithm.league.pools[name]
        assert pool.born == theirs.born and torch.equal(pool.wins, theirs.wins)
        for a, b in zip(pool.nets.state_dict().values(), theirs.nets.state_dict().values()):
            assert torch.equal(a, b)
    assert_same_acting(whole, again)


def assert_same_acting(a, b):
    """Two trainers' leagues: every frozen replica's draw, credit and weights alike."""
    for name, actor in a.algorithm.league.actors.items():
        theirs = b.algorithm.league.actors[name]
        for key in ("opponent", "drawn", "credit"):
            assert torch.equal(getattr(actor, key), getattr(theirs, key)), key
        for x, y in zip(actor.weights, theirs.weights, strict=True):
            assert torch.equal(x, y)


def test_league_games_are_recorded_against_the_snapshot_faced():
    """Episodes end every 12 steps here: each frozen replica's games count for the snapshot
    it faced, and every pool's statistics grow."""
    trainer = league_trainer()
    for _ in range(3):
        trainer.iterate(1e-3)
    for pool in trainer.algorithm.league.pools.values():
        assert float(pool.games.sum()) > 0
        assert bool((pool.games[~pool.filled] == 0).all())
        assert bool((pool.wins <= pool.games + 1e-6).all())


def test_a_frozen_policy_never_learns_and_plays_the_network_it_is_given():
    trainer = league_trainer(**{"trainer.league_frozen": ["tagger"]})
    algorithm = trainer.algorithm
    given = {k: torch.randn_like(v) if v.dtype.is_floating_point else v
             for k, v in algorithm.policies[0].model.state_dict().items()}
    algorithm.league.load_frozen({"tagger": given})
    assert [p.name for p in algorithm.policies] == ["tagger", "runner"]
    before = [q.clone() for q in algorithm.policies[0].model.parameters()]
    runner_before = [q.clone() for q in algorithm.policies[1].model.parameters()]
    assert before and runner_before
    trainer.iterate(1e-3)
    assert all(torch.equal(a, b) for a, b in zip(before, algorithm.policies[0].model.parameters(),
                                                  strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(runner_before,
                                                     algorithm.policies[1].model.parameters(),
                                                     strict=True))
    pool = algorithm.league.pools["tagger"]
    assert pool.filled.tolist().count(True) == 1
    held = pool.nets.member(0)  # the pool's acting network: every entry compared
    parameters = pool.nets.stacked()[0]
    assert parameters and set(parameters) <= set(held) <= set(given)
    for name, value in held.items():
        assert torch.equal(value, given[name]), name


@pytest.mark.parametrize("overrides, message", [
    ({"trainer.league_capacity": 0}, "'trainer.league_capacity' must be at least 1"),
    ({"trainer.league_opponents": "best"}, "'trainer.league_opponents' must be one of"),
    ({"trainer.league_learner_share": 1.0}, "'trainer.league_learner_share' must lie in"),
    ({"trainer.league": False, "trainer.league_snapshot_every": 10,
      "trainer.league_capacity": 4},
     "'trainer.league_capacity' applies with trainer.league: true"),
    ({"trainer.league_frozen": ["seeker"]}, "'trainer.league_frozen' must name some of"),
    ({"trainer.league_frozen": ["tagger", "runner"]}, "not all"),
    ({"trainer.population": 2}, "'trainer.league' with trainer.population"),
    # pools that cannot fit: refused before a copy is made (it took minutes, silently)
    ({"trainer.league_capacity": 100_000_000}, "trainer.league_capacity=100,000,000: 2 pools"),
])
def test_a_league_it_cannot_run_is_refused_in_one_line(overrides, message):
    with pytest.raises(GpusimError) as caught:
        league_trainer(**overrides)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_league_needs_two_policies():
    with pytest.raises(GpusimError, match="cartpole has one policy"):
        league_trainer("cartpole")


def test_a_league_run_directory_acts_exports_renders_and_resumes(tmp_path, capsys):
    """A league run's directory is a run's like any other: its final policies load, export
    and render; its checkpoint resumes (pool and all)."""
    import gpusim
    from gpusim import train
    from gpusim.training.trained import animation, network_export
    argv = ["--env", "tag_continuous", "--backend", "cpu", "--quiet", "--results_dir",
            str(tmp_path / "runs"), "--total_steps", "256", "--set", "trainer.num_envs=4",
            "--set", "trainer.rollout_len=16", "--set", "trainer.league=true",
            "--set", "trainer.league_snapshot_every=1", "--set", "trainer.final_eval_episodes=0",
            *[f"--set={k}={v}" for k, v in TAG.items()]]
    assert train.main(argv) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    policies = gpusim.load_policies(run_dir)
    assert set(policies) == {"tagger", "runner"}
    assert network_export.main([str(run_dir), "--format", "torchscript",
                        "--out", str(tmp_path / "exported")]) == 0
    assert animation.main([str(run_dir), "--max_steps", "3", "--out", str(tmp_path / "a.gif")]) == 0
    assert train.main(["--resume", str(run_dir), "--total_steps", "384"]) == 0
    assert "error" not in capsys.readouterr().err
    # the resumed run ends where one run straight to 384 steps ends: pools, games,
    # baselines and each replica's opponent alike
    argv[argv.index("--total_steps") + 1] = "384"
    argv[argv.index("--results_dir") + 1] = str(tmp_path / "straight")
    assert train.main(argv) == 0
    (straight,) = (tmp_path / "straight").iterdir()
    resumed, whole = league_state(run_dir), league_state(straight)
    assert resumed["iteration"] == whole["iteration"] == 6
    assert resumed["league"]["updates"] == whole["league"]["updates"] == 6
    for key in ("baseline", "seen"):
        assert torch.equal(resumed["league"][key], whole["league"][key]), key
    assert set(resumed["league"]["pools"]) == set(whole["league"]["pools"]) == {"tagger",
                                                                               "runner"}
    for name, pool in whole["league"]["pools"].items():
        theirs = resumed["league"]["pools"][name]
        assert pool["born"] == theirs["born"] and pool["nets"].keys() == theirs["nets"].keys()
        for key in ("filled", "recency", "games", "wins"):
            assert torch.equal(pool[key], theirs[key]), (name, key)
        for key, value in pool["nets"].items():
            assert torch.equal(value, theirs["nets"][key]), (name, key)
    assert resumed["opponents"].keys() == whole["opponents"].keys() == {"tagger", "runner"}
    for name, acting in whole["opponents"].items():
        theirs = resumed["opponents"][name]
        for key in ("opponent", "drawn", "gone", "source"):
            assert torch.equal(acting[key], theirs[key]), (name, key)
        for a, b in zip(acting["kept"], theirs["kept"], strict=True):
            assert torch.equal(a, b), name


def league_state(run_dir):
    """A run directory's latest checkpoint: its iteration, league and replicas' opponents."""
    from gpusim.training.records import checkpoint
    state = checkpoint.load_latest(run_dir / "checkpoints")
    return {"iteration": state["iteration"], "league": state["algorithm"]["league"],
            "opponents": state["ranks"][0]["algorithm"]["league"]["acting"]}
