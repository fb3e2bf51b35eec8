"""MkDocs hook: the repository's CHANGELOG.md as the site's changelog page (one file, kept at the root where
packagers and GitHub look for it)."""

from pathlib import Path

from mkdocs.structure.files import File


def on_files(files, config):
    changelog = Path(config["config_file_path"]).parent / "CHANGELOG.md"
    files.append(File.generated(config, "changelog.md", content=changelog.read_text()))
    return files
