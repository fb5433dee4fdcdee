"""Service settings, API keys and the import boundary: no server process needed."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from live_index import build_small

from indexes import Document
from retrieval.cli import main as cli_main
from retrieval.errors import InvalidQueryError, LimitExceededError, UnknownFieldError
from retrieval.service import ServiceConfigError, load_serve_config
from retrieval.service.auth import ApiKeys, load_api_keys
from retrieval.service.errors import (
    AuthenticationError,
    PayloadTooLargeError,
    RequestFieldError,
    ServiceUnavailableError,
    status_for,
)
from retrieval.service.settings import ServeConfig, ServerSettings

REPO = Path(__file__).resolve().parents[1]


def test_import_retrieval_pulls_in_no_service_dependency() -> None:
    code = ("import sys, retrieval, retrieval.service, retrieval.cli; "
            "print([m for m in ('fastapi', 'starlette', 'uvicorn', 'httpx', 'prometheus_client')"
            " if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"


def test_toml_file_env_override_and_cli_values_layer(tmp_path: Path) -> None:
    path = tmp_path / "serve.toml"
    path.write_text('[server]\nport = 9000\nworkers = 2\n[retriever]\ncandidates = 200\n'
                    '[retriever.cache]\nbackend = "none"\n')
    env = {"RETRIEVAL_SERVER__MAX_BODY_BYTES": "4096", "RETRIEVAL_DATA": "/elsewhere",
           "RETRIEVAL_RETRIEVER__LIMITS__MAX_K": "50"}
    config = load_serve_config(path, env, workers=3, host=None)
    assert (config.server.port, config.server.workers) == (9000, 3)
    assert config.server.host == "127.0.0.1" and config.server.log_query_text is False
    assert config.server.max_body_bytes == 4096
    assert config.retriever.candidates == 200 and config.retriever.limits.max_k == 50
    assert config.retriever.cache.backend == "none"


def test_json_file_round_trips_through_the_worker_spec(tmp_path: Path) -> None:
    path = tmp_path / "serve.json"
    path.write_text(json.dumps({"retriever": {"reload_interval_seconds": 5}}))
    config = load_serve_config(path, {})
    again = type(config).model_validate(json.loads(json.dumps(config.model_dump(mode="json"))))
    assert again == config


@pytest.mark.parametrize(("text", "env", "named"), [
    ('[server]\nprot = 1\n', {}, "server.prot"),
    ('[retriever]\ncandidate = 1\n', {}, "retriever.candidate"),
    ('[sever]\nport = 1\n', {}, "sever"),
    ('', {"RETRIEVAL_SERVER__WORKRES": "2"}, "RETRIEVAL_SERVER__WORKRES"),
    ('', {"RETRIEVAL_SERVR__PORT": "2"}, "RETRIEVAL_SERVR__PORT"),
])
def test_unknown_key_stops_start_up_naming_it(tmp_path: Path, text: str, env: dict[str, str],
                                               named: str) -> None:
    path = tmp_path / "serve.toml"
    path.write_text(text)
    with pytest.raises(ServiceConfigError, match="unknown key") as caught:
        load_serve_config(path, env)
    assert named in str(caught.value)


@pytest.mark.parametrize(("text", "message"), [
    ("[server]\nport = 'x'\n", "server.port"),
    ("[server]\ndrain_seconds = 40\n", "grace_period_seconds"),
    ("[server]\nssl_certfile = 'cert.pem'\n", "ssl_keyfile"),
    ("[server\n", "not valid"),
])
def test_invalid_values_are_typed_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "serve.toml"
    path.write_text(text)
    with pytest.raises(ServiceConfigError, match=message):
        load_serve_config(path, {})


def test_config_file_with_another_suffix_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text("server: {}\n")
    with pytest.raises(ServiceConfigError, match=".toml or .json"):
        load_serve_config(path, {})


def test_serve_command_exits_2_naming_the_unknown_key(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "serve.toml"
    path.write_text("[server]\nbind = '0.0.0.0'\n")
    assert cli_main(["serve", str(tmp_path), "--config", str(path)]) == 2
    assert "unknown key 'server.bind'" in capsys.readouterr().err


def test_serve_command_refuses_a_root_without_a_build(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["serve", str(tmp_path / "missing")]) == 2
    assert "error:" in capsys.readouterr().err


def test_api_keys_from_file_and_env(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text("# operators\nalpha-key\n\n")
    settings = ServerSettings(api_keys_file=str(keys_file), api_keys_env="SERVICE_KEYS")
    keys = load_api_keys(settings, {"SERVICE_KEYS": "beta-key, gamma-key"})
    assert keys.enabled
    for good in ("Bearer alpha-key", "bearer gamma-key", "Bearer  beta-key "):
        assert keys.accepts(good)
    for bad in (None, "", "Bearer", "Bearer alpha", "Basic alpha-key", "alpha-key",
                "Bearer alpha-key-2"):
        assert not keys.accepts(bad)
    assert not ApiKeys([]).enabled


def test_configured_but_empty_key_sources_are_errors(tmp_path: Path) -> None:
    empty = tmp_path / "keys"
    empty.write_text("# nothing\n")
    with pytest.raises(ServiceConfigError, match="holds no keys"):
        load_api_keys(ServerSettings(api_keys_file=str(empty)), {})
    with pytest.raises(ServiceConfigError, match="unset or empty"):
        load_api_keys(ServerSettings(api_keys_env="NOPE"), {})
    with pytest.raises(ServiceConfigError, match="cannot read"):
        load_api_keys(ServerSettings(api_keys_file=str(tmp_path / "absent")), {})


@pytest.mark.parametrize(("error", "status"), [
    (UnknownFieldError("x"), 400), (InvalidQueryError("x"), 400),
    (LimitExceededError("x"), 413), (PayloadTooLargeError("x"), 413),
    (RequestFieldError("x"), 422), (AuthenticationError("x"), 401),
    (ServiceUnavailableError("x"), 503),
])
def test_error_statuses(error: Exception, status: int) -> None:
    assert status_for(error) == status  # type: ignore[arg-type]


def test_a_mistyped_server_key_gets_the_closest_one(tmp_path: Path) -> None:
    """As the [retriever] table's keys do."""
    path = tmp_path / "serve.toml"
    path.write_text("[server]\nwrokers = 2\n")
    with pytest.raises(ServiceConfigError, match=r"unknown key 'server.wrokers' in the config "
                                                 r"file \(did you mean 'workers'\?\)"):
        load_serve_config(path, {})


@pytest.mark.parametrize(("spec", "says"), [
    ("'department = = x'", "filter syntax error at position 13"),
    ('{ "$or" = [] }', "$or takes a non-empty list"),
])
def test_a_named_filter_no_build_can_serve_stops_start_up(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str],
                                                          spec: str, says: str) -> None:
    """A syntax error started the server, which then retried the load forever, unready; a
    filter on fields the build lacks is still the build's to refuse (a later one may add
    them)."""
    path = tmp_path / "serve.toml"
    path.write_text(f"[named_filters]\ntenant = {spec}\n")
    assert cli_main(["serve", str(tmp_path), "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "named_filters (the config file): named filter 'tenant': " in err and says in err
    path.write_text("[named_filters]\ntenant = 'no_such_field >= 2010'\n")
    assert load_serve_config(path, {}).named_filters == {"tenant": "no_such_field >= 2010"}


def test_a_tls_file_that_does_not_load_stops_start_up_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Checked only in the workers: with 2 of them each failed as it started and was
    replaced, for ever, and the service never exited."""
    build_small(tmp_path / "index", [Document(f"d{i}", f"text {i}") for i in range(4)])
    path = tmp_path / "serve.toml"
    path.write_text(f"[server]\nworkers = 2\nssl_certfile = '{tmp_path / 'missing.pem'}'\n"
                    f"ssl_keyfile = '{tmp_path / 'missing-key.pem'}'\n")
    assert cli_main(["serve", str(tmp_path / "index"), "--config", str(path)]) == 2
    assert "server.ssl_certfile (or its key file) cannot be loaded" in capsys.readouterr().err


def test_an_address_in_use_stops_start_up_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """uvicorn's own bind failure came after the build loaded and exited 3, where every
    other deliberate start-up error exits 2 with one line."""
    build_small(tmp_path / "index", [Document(f"d{i}", f"text {i}") for i in range(4)])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli_main(["serve", str(tmp_path / "index"), "--port", str(port)]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


WORKERS_THAT_FAIL = """
import sys, uvicorn
from pathlib import Path
from retrieval.service.workers import run_forked_workers

def broken():
    raise RuntimeError("no app for this worker")

config = uvicorn.Config(broken, factory=True, host="127.0.0.1", port=0, log_level="critical")
sys.exit(run_forked_workers(config, 2, Path(sys.argv[1])))
"""


def test_workers_failing_as_they_start_stop_the_service(tmp_path: Path) -> None:
    """A worker that died was replaced whatever killed it: a fault every worker meets as it
    starts restarted them for ever, and the parent never exited."""
    build_small(tmp_path / "index", [Document(f"d{i}", f"text {i}") for i in range(4)])
    done = subprocess.run([sys.executable, "-c", WORKERS_THAT_FAIL, str(tmp_path / "index")],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 3, done.stderr[-2000:]
    assert "3 workers in a row failed as they started" in done.stderr


FREE_PORT = ServeConfig.model_validate({"server": {"port": 0}})  # start-up binds it to check


def test_serve_starts_on_the_last_good_build_when_the_live_one_does_not_read(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The workers serve the build live before a failing one, but the start-up check read
    only the live manifest: a restart exited 2 instead of degrading."""
    from indexes.errors import ArtifactError
    from indexes.manifest import resolve_build_dir
    from retrieval.cli.serve import check_before_start

    docs = [Document(f"d{i}", f"text {i}") for i in range(4)]
    build_small(tmp_path, docs)
    good = resolve_build_dir(tmp_path).name
    build_small(tmp_path, docs[:3])
    (resolve_build_dir(tmp_path) / "manifest.json").write_text("{not json")
    check_before_start(tmp_path, FREE_PORT)
    assert f"serving the last good build {good}" in caplog.text
    (tmp_path / "builds" / good / "manifest.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="manifest.json"):
        check_before_start(tmp_path, FREE_PORT)
