"""The demo model's training text: Jane Austen's six novels, the course's own texts, and
question-answer pairs about the course written for this project.

Austen comes from Debian's ``r-cran-janeaustenr`` package (the novels as R datasets; the
package is MIT-licensed and the novels are in the public domain), downloaded from Debian's
archive and checked against a pinned SHA-256, so the bytes are the same on every machine. The
``.deb`` is read here in pure Python (an ``ar`` archive holding ``data.tar.xz``); nothing is
installed.

The last :data:`HELDOUT_FRACTION` of each novel's paragraphs is held out: the model never trains
on it, and it is what its perplexity is measured on (``heldout.txt``).
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import random
import re
import subprocess
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.demo_training.rdata import read_lazyload_db

AUSTEN_DEB_URL = "https://deb.debian.org/debian/pool/main/r/r-cran-janeaustenr/r-cran-janeaustenr_1.0.0-1_all.deb"
AUSTEN_DEB_SHA256 = "df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95"
_AUSTEN_DATA = "usr/lib/R/site-library/janeaustenr/data/Rdata"
NOVELS = {  # dataset name in janeaustenr -> title
    "sensesensibility": "Sense and Sensibility",
    "prideprejudice": "Pride and Prejudice",
    "mansfieldpark": "Mansfield Park",
    "emma": "Emma",
    "northangerabbey": "Northanger Abbey",
    "persuasion": "Persuasion",
}
HELDOUT_FRACTION = 0.01

DEMO_DIR = Path(__file__).resolve().parent
QA_FILE = DEMO_DIR / "qa.jsonl"
# The course's own texts, relative to the repository root.
COURSE_TEXT_GLOBS = ("README.md", "lessons/l*/README.md", "site/*.md")


@dataclass
class Corpus:
    """Documents to train on, by source, and the held-out text.

    ``austen``: one string per novel (its training part); ``course``: one string per course text;
    ``qa``: one ChatML conversation per question-answer pair, in the chat template's format;
    ``heldout``: the held-out paragraphs of all six novels, joined by blank lines.
    ``inputs``: the SHA-256 of every input file, for the model card.
    """

    austen: list[str]
    course: list[str]
    qa: list[str]
    heldout: str
    inputs: dict[str, str]


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch_austen_deb(cache_dir: Path) -> bytes:
    """The pinned ``r-cran-janeaustenr`` .deb, from ``cache_dir`` or downloaded into it."""
    path = cache_dir / AUSTEN_DEB_URL.rsplit("/", 1)[1]
    if not path.is_file():
        cache_dir.mkdir(parents=True, exist_ok=True)
        print(f"downloading {AUSTEN_DEB_URL}")
        with urllib.request.urlopen(AUSTEN_DEB_URL, timeout=120) as response:
            data = response.read()
        if sha256_bytes(data) != AUSTEN_DEB_SHA256:
            raise RuntimeError(f"{AUSTEN_DEB_URL} does not have the pinned SHA-256 {AUSTEN_DEB_SHA256}")
        path.write_bytes(data)
    data = path.read_bytes()
    if sha256_bytes(data) != AUSTEN_DEB_SHA256:
        raise RuntimeError(f"{path} does not have the pinned SHA-256; delete it to download it again")
    return data


def deb_members(deb: bytes) -> dict[str, bytes]:
    """The members of a .deb, which is an ``ar`` archive: an 8-byte magic, then per member a
    60-byte header (name in bytes 0-16, decimal size in bytes 48-58) and the data, padded to even."""
    if not deb.startswith(b"!<arch>\n"):
        raise ValueError("not a .deb (ar) archive")
    members, pos = {}, 8
    while pos < len(deb):
        header = deb[pos : pos + 60]
        name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58])
        members[name] = deb[pos + 60 : pos + 60 + size]
        pos += 60 + size + (size & 1)
    return members


def austen_novels(deb: bytes) -> dict[str, list[str]]:
    """Each novel's paragraphs (whitespace collapsed, ``_italics_`` marks dropped), by title."""
    with tarfile.open(fileobj=io.BytesIO(deb_members(deb)["data.tar.xz"]), mode="r:xz") as tar:
        with tempfile.TemporaryDirectory() as tmp:
            for suffix in (".rdx", ".rdb"):
                member = tar.getmember("./" + _AUSTEN_DATA + suffix)
                (Path(tmp) / ("Rdata" + suffix)).write_bytes(tar.extractfile(member).read())
            datasets = read_lazyload_db(Path(tmp) / "Rdata")
    novels = {}
    for name, title in NOVELS.items():
        lines = [line or "" for line in datasets[name]]
        paragraphs = re.split(r"\n\s*\n", "\n".join(lines))
        cleaned = (re.sub(r"\s+", " ", p).replace("_", "").strip() for p in paragraphs)
        novels[title] = [p for p in cleaned if p]
    return novels


def course_texts(repo_root: Path, rev: str = "HEAD") -> dict[str, str]:
    """The course's markdown texts by path, as committed at ``rev`` of the repository (not as
    they are in the working tree, so that a commit names the corpus exactly), without mermaid
    diagrams and HTML comments."""
    def git(*args: str) -> str:
        try:
            out = subprocess.run(["git", "-C", str(repo_root), *args], capture_output=True, text=True, check=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise FileNotFoundError(f"cannot read the course texts from git in {repo_root} ({exc}): "
                                    "train from a clone of the repository") from None
        return out.stdout

    texts = {}
    committed = git("ls-tree", "-r", "--name-only", rev).splitlines()
    # fnmatch's `*` also matches `/`, as in a git pathspec
    for path in sorted(p for p in committed if any(fnmatch.fnmatchcase(p, g) for g in COURSE_TEXT_GLOBS)):
        text = git("show", f"{rev}:{path}")
        text = re.sub(r"```mermaid\n.*?```\n?", "", text, flags=re.S)
        text = re.sub(r"<!--.*?-->\n?", "", text, flags=re.S)
        texts[path] = text
    if not texts:
        raise FileNotFoundError(f"no course texts in git at {repo_root}: train from a clone of the repository")
    return texts


def chatml(question: str, answer: str) -> str:
    """One question-answer pair as a conversation in the chat template's format."""
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n{answer}<|im_end|>\n"


def read_qa(path: Path = QA_FILE) -> list[tuple[str, str]]:
    """The course's question-answer pairs, one JSON object per line."""
    pairs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            pairs.append((record["question"], record["answer"]))
    return pairs


def build_corpus(repo_root: Path, cache_dir: Path, rev: str = "HEAD") -> Corpus:
    """Everything the demo model trains on, and the held-out text (deterministic), with the course
    texts as committed at ``rev``."""
    deb = fetch_austen_deb(cache_dir)
    austen, heldout = [], []
    for _title, paragraphs in austen_novels(deb).items():
        cut = len(paragraphs) - max(1, round(HELDOUT_FRACTION * len(paragraphs)))
        austen.append("\n\n".join(paragraphs[:cut]))
        heldout.extend(paragraphs[cut:])
    course = course_texts(repo_root, rev)
    inputs = {AUSTEN_DEB_URL.rsplit("/", 1)[1]: AUSTEN_DEB_SHA256,
              "tests/demo_training/qa.jsonl": sha256_bytes(QA_FILE.read_bytes())}
    inputs.update({path: sha256_bytes(text.encode()) for path, text in course.items()})  # as trained on
    qa = [chatml(q, a) for q, a in read_qa()]
    return Corpus(austen=austen, course=list(course.values()), qa=qa, heldout="\n\n".join(heldout), inputs=inputs)


def words(text: str) -> list[str]:
    """Lower-case alphabetic words (apostrophes inside words kept): how the tests count real words."""
    return re.findall(r"[a-z]+(?:'[a-z]+)*", text.lower())


def shuffled(items: list[str], seed: int) -> list[str]:
    out = list(items)
    random.Random(seed).shuffle(out)
    return out
