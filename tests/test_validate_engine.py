"""`engine: builtin | sglang` in the deployment file: schema, validate, `--set engine=...`, `Deployment.engine`."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from specctl.cli.main import app
from specctl.schemas.deployment import DEFAULT_ENGINE, ENGINES
from specctl.schemas.validator import load_deployment, schema

runner = CliRunner()


def test_engine_defaults_to_builtin_and_is_set_by_override() -> None:
    assert load_deployment("tiny-pd").engine == DEFAULT_ENGINE == "builtin"
    assert load_deployment("tiny-pd", overrides=["engine=sglang"]).engine == "sglang"


def test_schema_and_model_agree_on_the_engines() -> None:
    prop = schema()["properties"]["engine"]
    assert tuple(prop["enum"]) == ENGINES and prop["default"] == DEFAULT_ENGINE


def test_validate_accepts_sglang_and_names_the_field_and_choices_for_a_typo() -> None:
    res = runner.invoke(app, ["validate", "tiny-pd", "--set", "engine=sglang", "--format", "json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["ok"] is True
    res = runner.invoke(app, ["validate", "tiny-pd", "--set", "engine=vllm", "--format", "json"])
    assert res.exit_code == 1
    (finding,) = json.loads(res.stdout)["files"][0]["findings"]
    assert (finding["code"], finding["path"]) == ("SCH004", "$.engine")
    assert "builtin" in finding["fix"] and "sglang" in finding["fix"]
