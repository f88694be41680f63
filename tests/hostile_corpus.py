"""A corpus of hostile and broken input files, generated in code (nothing large is stored).

Each entry is a file a user, a script or an adversary could hand to gpuwarden as a run spec or a
daemon config: alias bombs, deep nesting, huge files, non-UTF-8, Python object tags, path
traversal, wrong types. Every one of them must be refused with one line naming the problem.
`MARKER` is the file the Python-tag entries would create if a tag were ever executed.
"""

from __future__ import annotations

import os
from pathlib import Path

MARKER_NAME = "EXECUTED"
# Text no output may contain: the shadow-like entries' hashes and the values put in wrong keys.
SECRET = "SECRET-"
SHADOW_USERS = ("root", "daemon", "bin", "sys", "nobody")
MIB = 1024 * 1024


def _alias_bomb() -> str:
    """A "billion laughs": nine levels of nine aliases to the level below (9^9 leaves)."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, 10):
        refs = ", ".join([f"*a{level - 1}"] * 9)
        lines.append(f"a{level}: &a{level} [{refs}]")
    return "\n".join(lines) + "\n"


def _merge_bomb() -> str:
    """The same growth through merge keys (`<<`), which the constructor expands into mappings."""
    lines = ["m0: &m0 {k0: 1, k1: 1, k2: 1, k3: 1, k4: 1, k5: 1, k6: 1, k7: 1, k8: 1}"]
    for level in range(1, 10):
        refs = ", ".join([f"*m{level - 1}"] * 9)
        lines.append(f"m{level}: &m{level}\n  <<: [{refs}]\n  extra{level}: {{deep: [{refs}]}}")
    return "\n".join(lines) + "\n"


def _spec(train: str = "{task: image, batch_size: 2}", **top: str) -> str:
    head = {"name": "hostile", "kind": "train", "resources": "{gpus: 0}", **top}
    return "".join(f"{key}: {value}\n" for key, value in head.items()) + f"train: {train}\n"


def corpus(marker_dir: Path) -> dict[str, bytes]:
    """name → content. `marker_dir` is where an executed Python tag would leave its marker."""
    marker = marker_dir / MARKER_NAME
    texts: dict[str, str] = {
        "alias-bomb.yaml": _alias_bomb(),
        "merge-bomb.yaml": _merge_bomb(),
        "alias-chain.yaml": "".join(f"k{i}: &k{i} [{f'*k{i - 1}' if i else 1}]\n" for i in range(300)),
        "recursive-alias.yaml": "name: &x [*x]\n",
        "undefined-alias.yaml": "name: *nowhere\n",
        "deep-flow.yaml": "name: " + "[" * 200_000 + "\n",
        "deep-mapping.yaml": "name: " + "{a: " * 50_000 + "\n",
        "deep-block.yaml": "".join(" " * i + "a:\n" for i in range(300)),
        "many-values.yaml": "name: [" + ",".join(["1"] * 400_000) + "]\n",
        "long-value.yaml": _spec(description="x" * (900 * 1024)).replace(
            "name: hostile", "name: " + "n" * 5000
        ),
        "python-apply.yaml": f"name: !!python/object/apply:os.system ['touch {marker}']\n",
        "python-new.yaml": f"name: !!python/object/new:subprocess.Popen [[touch, '{marker}']]\n",
        "python-name.yaml": "name: !!python/name:os.system\nkind: train\n",
        "two-documents.yaml": _spec() + "---\n" + _spec(),
        "top-level-list.yaml": "- name: hostile\n- kind: train\n",
        "top-level-scalar.yaml": "just some words\n",
        "unhashable-key.yaml": "? [a, b]\n: 1\n",
        "traversal-name.yaml": _spec(name="../../../../tmp/escaped"),
        "traversal-policy.yaml": _spec(policy="../../../../../../../../etc/passwd"),
        "traversal-data.yaml": _spec(
            train="{task: causal_lm, model: ../../../../../../etc, data: ../../../../../../etc/passwd}"
        ),
        "wrong-type-section.yaml": _spec(train="[1, 2, 3]"),
        "wrong-type-number.yaml": _spec(train="{task: image, batch_size: lots}"),
        "negative-size.yaml": _spec(resources="{gpus: 0, memory_limit: -5GiB}"),
        "unknown-kind.yaml": _spec(kind="'rm -rf /'"),
        # What a link to /etc/shadow reads as: each line parses as a key. No message may echo one.
        "shadow-lines.yaml": "".join(
            f"{user}:$6$SECRET-{user}:20228:0:99999:7:::\n" for user in SHADOW_USERS
        ),
        "one-shadow-line.yaml": "root:$6$SECRET-root:20228:0:99999:7:::\n",
        "shadow-policy.yaml": _spec(policy="./shadow-lines.yaml"),
        # A secret pasted into the wrong key: messages show a short, cut excerpt of a value.
        "secret-value.yaml": _spec(train="{task: image, batch_size: TOPSECRET-VALUE-42}"),
        "secret-daemon-value.yaml": "log_level: TOPSECRET-VALUE-FOR-THE-DAEMON\n",
        # YAML's "\\0" is a NUL, which no program can be given in its arguments or environment.
        "nul-argv.yaml": "name: nul\nkind: command\nresources: {gpus: 0}\n"
        'command: {argv: [python3, "-c", "pass\\0rm -rf /"]}\n',
        "nul-env.yaml": "name: nul\nkind: command\nresources: {gpus: 0}\n"
        'command: {argv: [python3, "-c", pass]}\nenv: {TOKEN: "a\\0b"}\n',
        "nul-config-path.yaml": "name: nul\nkind: command\nresources: {gpus: 0}\n"
        'command: {argv: [python3, "{config_file}"], config_file: "/tmp/a\\0b.yaml"}\n',
    }
    out = {name: text.encode("utf-8") for name, text in texts.items()}
    # 20 MB of well-formed YAML: refused for its size before any of it is parsed.
    line = b"key_%07d: a value that is not short at all\n"
    out["huge.yaml"] = b"".join(line % i for i in range(20 * MIB // len(line % 0)))
    out["huge-one-line.yaml"] = b"name: " + b"x" * (20 * MIB)
    out["non-utf8.yaml"] = b"name: caf\xe9\nkind: train\n"
    out["utf16.yaml"] = "name: hostile\nkind: train\n".encode("utf-16")
    out["binary.yaml"] = bytes(range(256)) * 64
    return out


def write_corpus(folder: Path, marker_dir: Path) -> dict[str, Path]:
    """The corpus as files in `folder` (plus a folder and a FIFO where a file is expected)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for name, data in corpus(marker_dir).items():
        path = folder / name
        path.write_bytes(data)
        paths[name] = path
    directory = folder / "a-directory.yaml"
    directory.mkdir()
    paths["a-directory.yaml"] = directory
    fifo = folder / "a-fifo.yaml"
    os.mkfifo(fifo)
    paths["a-fifo.yaml"] = fifo
    paths["dev-zero"] = Path("/dev/zero")
    return paths


# -- a command run's own config file (`command.config_file`) ----------------------------------------


def config_corpus(marker_dir: Path) -> dict[str, bytes]:
    """name → content of config files a run's program could be given: each must be refused by
    every reader of `command.config_file` as a spec file is."""
    marker = marker_dir / MARKER_NAME
    deep = 100_000
    texts = {
        "cfg-deep.json": '{"a": ' + "[" * deep + "\n",
        "cfg-deep.toml": "a = " + "[" * deep + "\n",
        "cfg-deep-table.toml": "[" + ".".join(["t"] * deep) + "]\nx = 1\n",
        "cfg-deep.yaml": "a: " + "[" * deep + "\n",
        "cfg-deep-mapping.yaml": "a: " + "{b: " * 50_000 + "\n",
        "cfg-alias-bomb.yaml": _alias_bomb(),
        "cfg-merge-bomb.yaml": _merge_bomb(),
        "cfg-many-values.toml": "a = [" + ",".join(["1"] * 400_000) + "]\n",
        "cfg-many-values.json": '{"a": [' + ",".join(["1"] * 400_000) + "]}\n",
        "cfg-python-tag.yaml": f"a: !!python/object/apply:os.system ['touch {marker}']\n",
        "cfg-top-level-list.json": "[1, 2, 3]\n",
        "cfg-two-documents.yaml": "a: 1\n---\na: 2\n",
    }
    out = {name: text.encode("utf-8") for name, text in texts.items()}
    line = b'key_%07d = "a value that is not short at all"\n'
    out["cfg-50mb.toml"] = b"[training]\n" + b"".join(line % i for i in range(50 * MIB // len(line % 0)))
    out["cfg-binary.yaml"] = bytes(range(256)) * 64
    out["cfg-utf16.toml"] = "a = 1\n".encode("utf-16")
    return out


def write_config_corpus(folder: Path, marker_dir: Path) -> dict[str, Path]:
    """The config corpus as files in `folder`, plus a link to /dev/zero, a FIFO and a folder."""
    folder.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for name, data in config_corpus(marker_dir).items():
        path = folder / name
        path.write_bytes(data)
        paths[name] = path
    zero = folder / "cfg-dev-zero.yaml"
    zero.symlink_to("/dev/zero")
    fifo = folder / "cfg-fifo.toml"
    os.mkfifo(fifo)
    directory = folder / "cfg-directory.json"
    directory.mkdir()
    paths.update({zero.name: zero, fifo.name: fifo, directory.name: directory})
    return paths
