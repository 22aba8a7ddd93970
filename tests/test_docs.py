"""The README and docs/ name only what exists: every setting is in config/environment.py's EnvVar table, every
providers file is one llmgw accepts, every ``llmgw`` command, action and option is in the CLI's
``--help``, every link lands on a file and heading that exist, and every docs/ page is linked from
the README."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from llmgw.cli import build_parser
from llmgw.config import ENVIRONMENT_VARIABLES
from llmgw.config.providers_file import load_provider_config

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]

SETTINGS = {variable.name for variable in ENVIRONMENT_VARIABLES}
# Names in the docs that look like settings but are not llmgw's: each says whose it is.
NOT_SETTINGS = {
    "ANTHROPIC_API_KEY": "Claude Code's, pointed at the gateway",
    "ANTHROPIC_BASE_URL": "Claude Code's",
    "ANTHROPIC_MODEL": "Claude Code's",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL": "Claude Code's",
    "LLMGW_KEY": "the shell's gateway key, read by llmgw smoke and Codex, not by serve",
    "LLMGW_TEST_SCREENSHOTS": "the test suite's",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "the OpenTelemetry SDK's standard variable",
    "OTEL_METRIC_EXPORT_INTERVAL": "the OpenTelemetry SDK's standard variable",
    "MAX_JSON_DEPTH": "a constant in llmgw/api/body.py",
    "RLIMIT_NOFILE": "the kernel's",
    "SHUT_WR": "the socket API's",
    "SO_REUSEPORT": "the socket API's",
    "SUBJECT_UUID": "a placeholder in a command line",
    "AZURE_OPENAI_API_KEY": "a provider's key, named by its api_key_env",
    "GEMINI_API_KEY": "a provider's key, named by its api_key_env",
    "GROQ_API_KEY": "a provider's key, named by its api_key_env",
    "VLLM_API_KEY": "a provider's key, named by its api_key_env",
    "AWS_ACCESS_KEY_ID": "AWS's credential chain, read by botocore for kind = bedrock",
    "AWS_SECRET_ACCESS_KEY": "AWS's credential chain, read by botocore for kind = bedrock",
    "AWS_SESSION_TOKEN": "AWS's credential chain, read by botocore for kind = bedrock",
    "AWS_ROLE_ARN": "AWS's credential chain (web identity), set by EKS for IRSA",
    "AWS_WEB_IDENTITY_TOKEN_FILE": "AWS's credential chain (web identity), set by EKS for IRSA",
    "AWS_REGION": "AWS's, the region botocore's STS calls use",
    "GOOGLE_APPLICATION_CREDENTIALS": "Google's Application Default Credentials, read by google-auth",
    "IMAGE_SAFETY": "a Gemini finishReason",
    "MAX_TOKENS": "a Gemini finishReason",
    "PROHIBITED_CONTENT": "a Gemini finishReason",
    "RESOURCE_EXHAUSTED": "a Google API error status",
}
SETTING_NAME = re.compile(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b")

FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", flags=re.DOTALL | re.MULTILINE)
COMMENT = re.compile(r"(?:^|\s)#.*$", flags=re.MULTILINE)
INLINE = re.compile(r"`([^`\n]+)`")
# `llmgw keys create --name x`, `python -m llmgw db upgrade`: the command, then what follows it.
INVOCATION = re.compile(r"(?:^|[\s($])llmgw ([a-z][\w-]*)([^\n]*)")
# Not a log line quoted in code (`usage ledger: no spool in ...`): words and arguments only.
ACTION_NAMED = re.compile(r"([a-z][\w-]*) [a-z][\w-]*(?: [^\s:]+)*")
WORD = re.compile(r"\s*([a-z][\w-]*)")
OPTION = re.compile(r"(?<![\w-])--[a-z][\w-]*")
SUBCOMMAND = re.compile(r"^    ([a-z][\w-]*)(?:\s|$)", flags=re.MULTILINE)

LINK = re.compile(r"\]\(([^)\s]+)\)")


def text_of(page: Path) -> str:
    return page.read_text()


def code_of(page: Path) -> list[str]:
    """Fenced blocks (continuation lines joined, comments left out) and inline code spans."""
    text = text_of(page)
    blocks = [COMMENT.sub("", block.replace("\\\n", " ")) for block in FENCED.findall(text)]
    return blocks + INLINE.findall(FENCED.sub("", text))


def cli_help(*words: str) -> str:
    """What ``llmgw WORDS --help`` prints, from the parser the CLI runs."""
    out = io.StringIO()
    with (
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(io.StringIO()),
        pytest.raises(SystemExit),
    ):
        build_parser().parse_args([*words, "--help"])
    return out.getvalue()


def subcommands(help_text: str) -> set[str]:
    _, found, positional = help_text.partition("positional arguments:")
    if not found:
        return set()
    positional = positional.split("\n\n", 1)[0]
    return set(SUBCOMMAND.findall(positional))


def invocations() -> list[tuple[str, list[str], str]]:
    """(page, words of the command, the rest of its line) for every ``llmgw`` command named."""
    with_actions = {
        command for command in subcommands(cli_help()) if subcommands(cli_help(command))
    }
    found = []
    for page in PAGES:
        for code in code_of(page):
            # A span naming an action without the program: `keys create`, `db downgrade base`.
            bare = ACTION_NAMED.fullmatch(code)
            if "llmgw" not in code and bare and bare.group(1) in with_actions:
                code = "llmgw " + code
            for match in INVOCATION.finditer(code):
                words = [match.group(1)]
                rest = match.group(2)
                # The action, for a command that has actions (`keys create`, `db upgrade`).
                if subcommands(cli_help(words[0])) and (action := WORD.match(rest)):
                    words.append(action.group(1))
                    rest = rest[action.end() :]
                found.append((page.name, words, rest))
    return found


def test_the_readme_is_a_landing_page() -> None:
    """Read in five minutes: the two commands, an example per API, links to the rest."""
    text = text_of(README)
    assert len(text.splitlines()) < 200
    assert "pip install -e '.[test,dev]'" in text  # .ci/run's install command
    assert "```bash\npytest\n```" in text  # .ci/run's test command


def test_every_docs_page_is_linked_from_the_readme() -> None:
    assert DOCS, "docs/ holds the manual"
    linked = {
        (README.parent / target.split("#")[0]).resolve() for target in LINK.findall(text_of(README))
    }
    assert [page.name for page in DOCS if page.resolve() not in linked] == []


def test_every_setting_named_is_in_the_env_var_table() -> None:
    named = {name for page in PAGES for name in SETTING_NAME.findall(text_of(page))}
    assert sorted(named - SETTINGS - NOT_SETTINGS.keys()) == []
    # An exception no page names any more is one to drop, or a setting renamed under it.
    assert sorted(NOT_SETTINGS.keys() - named) == []


def test_the_configuration_page_lists_every_setting() -> None:
    rows = re.findall(
        r"^\| `([A-Z][A-Z0-9_]+)` \|", text_of(ROOT / "docs" / "configuration.md"), re.M
    )
    assert sorted(rows) == sorted(SETTINGS)


def providers_files() -> list[tuple[str, str]]:
    return [
        (page.name, block)
        for page in PAGES
        for block in FENCED.findall(text_of(page))
        if "[[providers]]" in block
    ]


@pytest.mark.parametrize(("page", "document"), providers_files())
def test_every_providers_file_shown_is_one_llmgw_accepts(
    page: str, document: str, tmp_path: Path
) -> None:
    path = tmp_path / "llmgw.toml"
    path.write_text(document)
    environ = dict.fromkeys(re.findall(r'api_key_env = "(\w+)"', document), "a-provider-key")
    config = load_provider_config(path, environ)  # raises, naming the key, on an unknown one
    assert config.providers, page


def test_providers_files_are_found() -> None:
    assert {page for page, _ in providers_files()} >= {"providers-and-routing.md", "accounting.md"}


def test_every_cli_command_named_exists() -> None:
    commands = subcommands(cli_help())
    named = invocations()
    assert {tuple(words) for _, words, _ in named} >= {("serve",), ("keys", "create"), ("smoke",)}
    missing = []
    for page, words, rest in named:
        if words[0] not in commands:
            missing.append(f"{page}: llmgw {words[0]}")
            continue
        actions = subcommands(cli_help(words[0]))
        if actions and (len(words) < 2 or words[1] not in actions):
            missing.append(f"{page}: llmgw {' '.join(words)} (actions: {sorted(actions)})")
            continue
        options = set(OPTION.findall(cli_help(*words)))
        missing += [
            f"{page}: llmgw {' '.join(words)} {o}" for o in OPTION.findall(rest) if o not in options
        ]
    assert missing == []


def heading_anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings (code blocks left out; repeats get -1, -2, ...)."""
    anchors: set[str] = set()
    for heading in re.findall(r"^#+ (.+)$", FENCED.sub("", text_of(page)), flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in anchors:
            n += 1
            anchor = f"{slug}-{n}"
        anchors.add(anchor)
    return anchors


def test_every_link_lands() -> None:
    broken = []
    for page in PAGES:
        for target in LINK.findall(FENCED.sub("", text_of(page))):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            landing = (page.parent / file).resolve() if file else page
            if not landing.exists() or (anchor and anchor not in heading_anchors(landing)):
                broken.append(f"{page.name}: {target}")
    assert broken == []
