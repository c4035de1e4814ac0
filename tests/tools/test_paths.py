"""The files ``plugrl run --print-config`` looks for before it prints the recipe."""

from plugrl_tools.paths import missing_files


def test_missing_data_and_reward_files_are_named(plugrl_recipe, tmp_path):
    (tmp_path / "train.parquet").touch()
    recipe = plugrl_recipe(
        {
            "data.train_files": [str(tmp_path / "train.parquet"), str(tmp_path / "more.parquet")],
            "data.val_files": [str(tmp_path / "test.parquet")],
            "reward.custom_function.path": str(tmp_path / "score.py"),
        }
    )
    assert missing_files(recipe) == [
        ("data.train_files", str(tmp_path / "more.parquet")),
        ("data.val_files", str(tmp_path / "test.parquet")),
        ("reward.custom_function.path", str(tmp_path / "score.py")),
    ]


def test_a_home_relative_path_is_looked_for_in_home(plugrl_recipe, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "train.parquet").touch()
    assert missing_files(plugrl_recipe({"data.train_files": ["~/train.parquet"]})) == []
