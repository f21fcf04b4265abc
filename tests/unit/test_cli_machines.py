"""`runstate machines show|lint|list` from the command line."""

from pathlib import Path

from click.testing import CliRunner

from processor.cli.main import cli
from tests.unit.test_machines import GOOD


def test_show_prints_table_and_mermaid() -> None:
    result = CliRunner().invoke(cli, ["machines", "show", "owned_run"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "run_completed" in result.output and "guard success_criteria" in result.output
    assert "```mermaid\nstateDiagram-v2\n" in result.output


def test_show_mermaid_only_and_unknown_name() -> None:
    runner = CliRunner()
    only = runner.invoke(cli, ["machines", "show", "run_state", "--format", "mermaid"])
    assert only.output.startswith("stateDiagram-v2\n")
    missing = runner.invoke(cli, ["machines", "show", "nope"])
    assert (
        missing.exit_code == 1 and "loaded: owned_run, run_state, task_lifecycle" in missing.output
    )


def test_show_a_user_machine_from_the_environment(tmp_path: Path) -> None:
    (tmp_path / "review.yaml").write_text(GOOD)
    result = CliRunner().invoke(
        cli,
        ["machines", "show", "review", "--format", "table"],
        env={"RUNSTATE_MACHINE_PATH": str(tmp_path), "COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert "reviewing" in result.output


def test_lint_reports_lines_and_exit_code(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("to: merged}", "to: merjed}"))
    runner = CliRunner()
    ok = runner.invoke(cli, ["machines", "lint", str(good)])
    assert ok.exit_code == 0 and "good.yaml: ok" in ok.output
    result = runner.invoke(
        cli, ["machines", "lint", str(good), str(bad), str(tmp_path / "no.yaml")]
    )
    assert result.exit_code == 1
    assert f"{bad}:12: transitions.1.to: unknown state 'merjed'" in result.output
    assert "cannot read" in result.output


def test_list_and_bad_machine_path(tmp_path: Path) -> None:
    runner = CliRunner()
    listed = runner.invoke(cli, ["machines", "list"], env={"COLUMNS": "200"})
    assert listed.exit_code == 0 and "task_lifecycle" in listed.output
    (tmp_path / "broken.yaml").write_text("name: [\n")
    broken = runner.invoke(cli, ["machines", "list", "--machine-path", str(tmp_path)])
    assert broken.exit_code == 1 and "cannot load machines" in broken.output
