"""The joined stream's flags: what they build, and every misuse refused by name."""

import json

import pytest

from picasso.pipelines.cli import main as cli
from picasso.pipelines.cli.stream import stream_config


def config(tmp_path, *flags):
    return stream_config(cli.parse_args(["stream", "--workdir", str(tmp_path), "--publish-every", "0", *flags]))


def test_the_flags_make_a_joined_stream_over_the_spec_section(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({"label": "clicked", "sparse": [{"name": "item", "embedding_dim": 4, "hash_buckets": 9}],
                                "join": {"key": "request_id", "wait": "10m", "orphan_grace": "30s"}}))
    made = config(tmp_path, "--spec", str(spec), "--impressions", "imps", "--labels", "labs:arrow",
                  "--join-key", "request_id, item", "--late-labels", "correct", "--allowed-lateness", "5s")
    assert made.topics == {"imps": "json", "labs": "arrow"}
    join = made.joined.join
    assert (made.joined.impressions, made.joined.labels) == ("imps", "labs")
    assert join.key == ("request_id", "item") and join.wait_ms == 600_000 and join.orphan_grace_ms == 30_000
    assert join.late_labels == "correct" and join.allowed_lateness_ms == 5_000
    assert config(tmp_path, "--impressions", "a", "--labels", "b", "--label-wait", "90s").joined.join.wait_ms == 90_000


@pytest.mark.parametrize("flags, problem", [
    (["--labels", "labs"], "takes --impressions and --labels"),
    (["--impressions", "a", "--labels", "b", "--topic", "c"], "and no --topic"),
    (["--impressions", "a", "--labels", "a"], "two topics"),
    (["--impressions", "a:tsv", "--labels", "b"], "json or arrow, not tsv"),
    (["--topic", "t", "--label-wait", "5m"], "--label-wait: only for a joined stream"),
    ([], "needs --topic"),
])
def test_misused_flags_are_refused_by_name(tmp_path, flags, problem):
    with pytest.raises(ValueError, match=problem):
        config(tmp_path, *flags)


def test_a_wait_without_a_unit_is_refused_by_argparse(capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(["stream", "--workdir", "w", "--impressions", "a", "--labels", "b", "--label-wait", "15"])
    assert "--label-wait: duration '15' has no unit" in capsys.readouterr().err
