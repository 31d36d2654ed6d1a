"""Template miner: accuracy on real Loghub samples, persistence, bounded state, hostile input."""

from __future__ import annotations

import csv
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vigil.logs.masking import mask, tidy, values_of
from vigil.logs.miner import MAX_LINE_BYTES, TemplateMiner, read_lines
from vigil.model import VigilInputError
from vigil_eval.logaccuracy import grouping_accuracy, parsing_accuracy


def load_loghub(shared_data: Path, system: str) -> tuple[list[str], list[str]]:
    path = shared_data / "loghub2k_corrected" / system / f"{system}_2k.log_structured_corrected.csv"
    rows = list(csv.DictReader(path.open(newline="", encoding="utf-8")))
    return [r["Content"] for r in rows], [r["EventTemplate"] for r in rows]


def test_mask_replaces_values_and_keeps_text() -> None:
    assert mask("PacketResponder 1 for block blk_-695229586 terminating") == (
        "PacketResponder <*> for block <*> terminating")
    assert mask("ready=true,policy=3") == "ready=<*>,policy=<*>"
    assert mask("connection from 10.0.0.1 (host.example.net) at Fri Jun 17 07:07:00 2005") == (
        "connection from <*> (<*>) at <*>")
    assert mask("loaded /usr/lib/libnccl.so.2 ok") == "loaded <*> ok"


def test_template_text_follows_the_corrected_truth_conventions() -> None:
    # numbers standing alone are values (with their sign), a word glued to a value is part of it, values joined by a
    # dot are one, booleans / null are values; a word that only holds a digit is text
    assert tidy("generating core.1234") == "generating core.<*>"
    assert tidy("child init 1 -2") == "child init <*> <*>"
    assert tidy("block blk_<*> at <*>.<*>.<*>") == "block <*> at <*>"
    assert tidy("setLightsOn(true) opt-in: False (null)") == "setLightsOn(<*>) opt-in: <*> (<*>)"
    assert tidy("jk2_init() on tty2 ee0 L3 PS/2 CPU#0 0x1f") == "jk2_init() on tty2 ee0 L3 PS/<*> CPU#<*> <*>"
    assert tidy("loaded /usr/lib/libnccl.so:2") == "loaded <*>:<*>"
    assert values_of("from 10.0.0.1 (host.example.net) at Fri Jun 17 07:07:00 2005 init 1 -2") == [
        "10.0.0.1", "host.example.net", "Fri Jun 17 07:07:00 2005", "1 -2"]


def test_a_template_reads_as_its_lines_wrote_it() -> None:
    miner = TemplateMiner()
    lines = [f"jk2_init() Found child {pid} in scoreboard slot {slot}" for pid, slot in ((6725, 10), (6726, 8))]
    lines += [f"generating core.{n}" for n in (2275, 31, 864)]
    lines += [f"mod_jk child init {a} {b}" for a, b in ((1, -2), (3, -4))]
    lines += [f"connection from 10.0.0.{n} ({host}) at Fri Jun {n} 07:07:00 2005"
              for n, host in ((1, "a.example.net"), (2, ""), (3, "b.example.org"))]
    lines += [f"Auth successful for job_1445144423722_00{n} (auth:SIMPLE)" for n in (10, 20)]
    lines += [f"Address change detected. Old: msra-sa-41/10.190.173.{n}:8030 New: msra-sa-41:8030" for n in (1, 2)]
    found = [m.template for m in miner.add_block(lines)]
    assert found[0] == "jk2_init() Found child <*> in scoreboard slot <*>"  # never varied: text
    assert found[2] == "generating core.<*>"  # the number varies, the word before it does not
    assert found[5] == "mod_jk child init <*> <*>"  # two numbers, two values
    assert found[7] == "connection from <*> (<*>) at <*>"  # the brackets all lines wrote; a date is one value
    assert found[10] == "Auth successful for <*> (auth:SIMPLE)"  # an id; a field value that never varied
    assert found[12] == "Address change detected. Old: <*> New: <*>"  # host, address and port are one value
    # against the truth's text, line by line
    assert parsing_accuracy(found[:2], ["jk2_init() Found child <*> in scoreboard slot <*>"] * 2) == 1.0


def test_a_word_that_varies_only_in_its_digits_becomes_a_value() -> None:
    # lines that differ only in their digits share a cache entry; the word the template kept is checked on them
    miner = TemplateMiner()
    assert miner.add("link up on interface ee0 after 3 s").template == "link up on interface ee0 after <*> s"
    assert miner.add("link up on interface ee1 after 5 s").template == "link up on interface <*> after <*> s"


def test_template_text_survives_restart(tmp_path: Path) -> None:
    state = tmp_path / "templates.json"
    miner = TemplateMiner()
    before = miner.add_block([f"generating core.{n} on node-{n % 7}" for n in range(40)])[-1]
    miner.save(state)
    restored = TemplateMiner.load(state)
    assert restored.templates[before.template_id].text == before.template == "generating core.<*> on node-<*>"


def test_block_masking_equals_line_masking() -> None:
    lines = ["a 1 b", "Jul 17 03:04:05 host x=1", "c d", "10.0.0.1:80 up"]
    assert mask("\n".join(lines)).split("\n") == [mask(line) for line in lines]


@pytest.mark.parametrize("system", ["HDFS", "Android", "OpenStack", "Linux"])
def test_grouping_accuracy_on_loghub(shared_data: Path, system: str) -> None:
    contents, truth = load_loghub(shared_data, system)
    miner = TemplateMiner()
    predicted = [t.id for t in miner.add_templates(contents)]
    # Measured 0.88-1.0 on these systems; the floor leaves room for order effects, not for regressions.
    assert grouping_accuracy(predicted, truth) >= 0.85


def test_template_text_on_loghub(shared_data: Path) -> None:
    systems = ["Android", "Apache", "BGL", "HDFS", "HPC", "Hadoop", "Linux", "OpenStack", "Windows", "Zookeeper"]
    scores = []
    for system in systems:
        contents, truth = load_loghub(shared_data, system)
        scores.append(parsing_accuracy([t.text for t in TemplateMiner().add_templates(contents)], truth))
    # Measured 0.895 mean (0.668-1.000) on these development systems; 0.693 before templates read as their lines
    assert sum(scores) / len(scores) >= 0.85 and min(scores) >= 0.6


def test_a_learned_line_matches_its_block_template(shared_data: Path) -> None:
    contents, truth = load_loghub(shared_data, "BGL")
    miner = TemplateMiner()
    learned = miner.add_block(contents[:500])
    assert all(miner.match(line) == found for line, found in zip(contents[:500], learned, strict=True))
    # Learning in small blocks sees less at once: the groups stay close to the truth all the same
    small = TemplateMiner()
    predicted = [m.template_id for i in range(0, 2000, 100) for m in small.add_block(contents[i:i + 100])]
    assert grouping_accuracy(predicted, truth) >= 0.85


def test_many_words_at_one_position_are_a_variable_two_are_two_events() -> None:
    users = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
             "lima"]
    miner = TemplateMiner()
    found = miner.add_block([f"Received block from host {u} in the rack zone now" for u in users])
    assert len({m.template_id for m in found}) == 1
    assert found[0].template == "Received block from host <*> in the rack zone now"
    events = miner.add_block(["Connection opened"] * 5 + ["Connection closed"] * 5)
    assert events[0].template_id != events[-1].template_id and events[0].template == "Connection opened"


def test_a_word_recurring_in_two_messages_is_a_value() -> None:
    lines = [line for user in ("cyrus", "news") for line in (f"session opened for user {user} by (uid=0)",
                                                             f"session closed for user {user}")] * 3
    found = TemplateMiner().add_block(lines)
    assert {m.template for m in found} == {"session opened for user <*> by (uid=<*>)", "session closed for user <*>"}


def test_a_word_where_other_lines_hold_a_value_is_a_value() -> None:
    found = TemplateMiner().add_block(["connection from 10.0.0.1 (host.example.net) at 5",
                                       "connection from 10.0.0.2 () at 6"] * 3)
    assert len({m.template_id for m in found}) == 1


# Lines written for these tests in the shape of a proxy's connection log: a size with or without its
# human-readable form, a lifetime as a clock or as "<1 sec".
SIZED = ["gw.example.org:8080 close, 1190 bytes (1.16 KB) sent, 1671 bytes (1.63 KB) received, lifetime 00:02",
         "gw.example.org:8080 close, 0 bytes sent, 0 bytes received, lifetime 00:01",
         "gw.example.org:8080 close, 403 bytes sent, 426 bytes received, lifetime <1 sec",
         "gw.example.org:8080 close, 850 bytes sent, 10547 bytes (10.2 KB) received, lifetime 00:02",
         "gw.example.org:8080 close, 12000 bytes (11.7 KB) sent, 66 bytes received, lifetime 00:03"]


def test_a_word_the_stream_writes_as_a_field_value_is_a_value() -> None:
    users = ["root", "uucp", "ftp", "git"]
    failed = [f"Failed password for {user} from 10.0.0.{n} port 22" for n, user in enumerate(users)] * 3
    # alone, four words at one position are four events
    assert len({m.template_id for m in TemplateMiner().add_block(failed)}) == 4
    # the same stream also writes them as user=<name>: they are values
    pam = [f"authentication failure; rhost=10.0.0.{n} user={user}" for n, user in enumerate(users)]
    found = TemplateMiner().add_block(pam + failed)
    assert len({m.template_id for m in found[len(pam):]}) == 1
    assert found[-1].template == "Failed password for <*> from <*> port <*>"
    # off: four events again
    off = TemplateMiner(field_values=False).add_block(pam + failed)
    assert len({m.template_id for m in off[len(pam):]}) == 4


def test_a_word_split_off_in_an_early_block_joins_once_its_position_holds_values(tmp_path: Path) -> None:
    # two process names seen alone in one block read as two events; a later block with more names than
    # max_split_values shows the position holds values: it generalises one of the two, and the other joins it
    names = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo"]
    miner = TemplateMiner()
    early = miner.add_templates([f"Out of memory: killed process {n} ({name})" for name in ("python", "java")
                                 for n in range(50)])
    assert [early[0].text, early[-1].text] == ["Out of memory: killed process <*> (python)",
                                               "Out of memory: killed process <*> (java)"]
    later = miner.add_templates([f"Out of memory: killed process {n} ({name})" for n, name in enumerate(names)])
    assert len({t.id for t in later}) == 1 and later[0].text == "Out of memory: killed process <*> (<*>)"
    assert miner.canonical(early[0]) is miner.canonical(early[-1]) is later[0]
    assert {miner.add(f"Out of memory: killed process 7 ({name})").template_id
            for name in ("python", "java")} == {later[0].id}
    state = tmp_path / "templates.json"
    miner.save(state)
    assert TemplateMiner.load(state).add("Out of memory: killed process 8 (java)").template_id == later[0].id
    # two events in two blocks stay two: nothing showed that their position holds values
    events = TemplateMiner()
    opened = events.add_templates(["Connection opened by peer"] * 5)[0]
    closed = events.add_templates(["Connection closed by peer"] * 5)[0]
    assert events.canonical(opened) is not events.canonical(closed)


def test_a_few_words_wrapped_in_brackets_are_values(tmp_path: Path) -> None:
    names = ["sshd", "httpd", "mysqld", "java", "python", "crond"]
    killed = [f"Out of Memory: Killed process {100 + n} ({names[n % 6]})." for n in range(60)]
    # six process names in parentheses are one event with a value, where six bare words would be six events
    found = TemplateMiner().add_block(killed)
    assert {m.template for m in found} == {"Out of Memory: Killed process <*> (<*>)."}
    assert len({m.template_id for m in TemplateMiner(max_slot_values=10).add_block(killed)}) == 6
    # two states in parentheses stay two events
    e820 = [f"BIOS-e820: {n:016x} - {n + 5:016x} ({'usable' if n % 2 else 'reserved'})" for n in range(8)]
    assert {m.template for m in TemplateMiner().add_block(e820)} == {"<*> - <*> (usable)", "<*> - <*> (reserved)"}
    # so do words in different brackets, and the setting is saved with the state
    mixed = [f"link {n} {word}" for n, word in enumerate(["(up)", "[down]", "'idle'", "<gone>"] * 3)]
    assert len({m.template_id for m in TemplateMiner().add_block(mixed)}) == 4
    state = tmp_path / "templates.json"
    TemplateMiner(max_slot_values=5).save(state)
    assert TemplateMiner.load(state).max_slot_values == 5


def test_a_value_of_more_words_keeps_its_statement_together() -> None:
    found = TemplateMiner().add_block(SIZED * 3)
    assert len({m.template_id for m in found}) == 1
    # line by line, in separate blocks, the same
    miner = TemplateMiner()
    assert len({miner.add(line).template_id for line in SIZED}) == 1
    # off: each word count is its own template
    assert len({m.template_id for m in TemplateMiner(max_unit_letters=-1).add_block(SIZED * 3)}) > 1


def test_extra_text_or_a_field_is_another_statement() -> None:
    miner = TemplateMiner()
    pairs = [("Probing PCI hardware", "Probing PCI hardware (bus 00)"),  # a word before the value: text
             ("auth failure; rhost=10.0.0.1", "auth failure; rhost=10.0.0.1 user=root"),  # a key=value field
             ("Fan speeds ( 3552 3534 3375 3515 3479 )", "Fan speeds ( 3552 3534 **** 3515 3479 )"),  # no letter
             ("Failed password for root from 10.0.0.1 port 22",
              "Failed password for invalid user 10.0.0.1 port 22")]  # long words
    for short, long in pairs:
        first, second = miner.add_block([short] * 3 + [long] * 3)[::3]
        assert first.template_id != second.template_id, (short, long)


def test_a_count_that_leads_a_statement_makes_another_statement() -> None:
    # a value with a short word before the whole statement, on one side only: another event, not a variant
    # (a unit word after a value, as in the sizes above, still makes one)
    lines = [f"authentication failure; logname= uid=0 rhost=10.0.0.{n} user=root" for n in range(6)]
    lines += ["1 more authentication failure; logname= uid=0 rhost=10.0.0.9 user=root"] * 2
    found = TemplateMiner().add_block(lines)
    assert found[0].template_id != found[-1].template_id
    assert found[-1].template.startswith("<*> more authentication failure;")
    # line by line (the count met after its statement was learned), the same
    miner = TemplateMiner()
    ids = [miner.add(line).template_id for line in lines]
    assert ids[0] == ids[5] != ids[-1]
    # a bare count before the statement is still a value of the same statement
    miner = TemplateMiner()
    bare = [miner.add(line).template_id for line in ("disk sync done", "12 disk sync done", "disk sync done")]
    assert len(set(bare)) == 1


# kernel oops backtrace frames, symbol+offset/size as the kernel's %pS prints them
FRAMES = ["do_page_fault", "__alloc_pages", "handle_mm_fault", "schedule", "put_user_size", "do_swap_page",
          "filemap_nopage", "do_no_page", "swapin_readahead", "follow_page", "rw_vm", "vt_console_print",
          "do_exit", "acct_process"]


def test_each_function_of_a_backtrace_is_its_own_frame(tmp_path: Path) -> None:
    rng = random.Random(7)
    lines = [f"[<{rng.randrange(1 << 28):08x}>] {name}+0x{rng.randrange(4096):x}/0x{rng.randrange(4096, 8192):x}"
             for _ in range(3) for name in FRAMES]
    assert mask("[<02114537>] do_page_fault+0x12f/0x446 [ext3]") == "[<<*>>] do_page_fault+<*> [<*>]"
    assert values_of("[<02114537>] do_page_fault+0x12f/0x446") == ["02114537", "0x12f/0x446"]
    assert mask("[<0a8ddb99>] ext3_file_write+0x19/0x88 [ext3]") == "[<<*>>] ext3_file_write+<*> [<*>]"
    assert mask("at foo-bar+0x1f and 0x1f+0x2 and x+12") == "at <*> and <*> and <*>"  # no symbol: the whole token
    block = ["[<02114537>] do_page_fault+0x12f/0x446", "x=1 y 7", "up 0x1f+0x2"]
    assert mask("\n".join(block)).split("\n") == [mask(line) for line in block]
    miner = TemplateMiner()
    found = [t for i in range(0, len(lines), 8) for t in miner.add_templates(lines[i:i + 8])]
    by_name: dict[str, set[str]] = {}
    for line, template in zip(lines, found, strict=True):
        by_name.setdefault(line.split()[1].split("+")[0], set()).add(miner.canonical(template).id)
    assert all(len(ids) == 1 for ids in by_name.values())
    assert len({next(iter(ids)) for ids in by_name.values()}) == len(FRAMES)
    assert miner.canonical(found[0]).text == "[<*>] do_page_fault+<*>"  # as the corrected truth writes it
    # the same holds for key=value fields of different keys at one position
    fields = [f"audit: op={op} {key}={n}" for n in range(12) for op, key in (("open", "pid"), ("open", "uid"))]
    assert len({m.template_id for m in TemplateMiner().add_block(fields)}) == 2
    state = tmp_path / "templates.json"
    miner.save(state)
    restored = TemplateMiner.load(state)
    assert restored.add(lines[1]).template_id == miner.canonical(found[1]).id


def test_a_variant_survives_restart(tmp_path: Path) -> None:
    state = tmp_path / "templates.json"
    miner = TemplateMiner()
    ids = {m.template_id for m in miner.add_block(SIZED[:3])}
    miner.save(state)
    restored = TemplateMiner.load(state)
    assert {restored.add(line).template_id for line in SIZED} == ids
    assert restored.match(SIZED[0]) == restored.match(SIZED[1])


def test_state_survives_restart(tmp_path: Path) -> None:
    state = tmp_path / "state" / "templates.json"
    miner = TemplateMiner()
    before = miner.add("worker 17 finished step 3 in 0.51 s")
    miner.save(state)
    restored = TemplateMiner.load(state)
    assert restored.match("worker 4 finished step 99 in 1.5 s") == before
    after = restored.add("brand new message kind")
    assert after.template_id not in {before.template_id}
    assert int(after.template_id[1:]) > int(before.template_id[1:])


def test_corrupt_state_is_a_clear_error(tmp_path: Path) -> None:
    state = tmp_path / "templates.json"
    state.write_text("{not json")
    with pytest.raises(VigilInputError, match="templates.json"):
        TemplateMiner.load(state)


def test_template_table_is_bounded() -> None:
    miner = TemplateMiner(max_templates=50, max_cache=100)
    for i in range(2000):
        miner.add(f"event kind{chr(97 + i % 26)}{chr(97 + (i // 26) % 26)}{chr(97 + (i // 676) % 26)} done")
    assert len(miner.templates) <= 50
    assert len(miner._cache) <= 100 and len(miner._digit_cache) <= 100 and len(miner._width_cache) <= 100


def test_read_lines_survives_hostile_bytes(tmp_path: Path) -> None:
    path = tmp_path / "hostile.log"
    hostile = b"ok line 1\n\xff\xfe\x00bad \xc3\x28 utf8\n"
    path.write_bytes(hostile + b"x" * (MAX_LINE_BYTES * 3) + b"\nlast 2\n")
    lines = [line for block in read_lines(path) for line in block]
    assert lines[0] == "ok line 1"
    assert "\x00" not in lines[1] and "\ufffd" in lines[1]
    assert len(lines[2]) == MAX_LINE_BYTES
    assert lines[-1] == "last 2"
    miner = TemplateMiner()
    assert len(miner.add_block(lines)) == len(lines)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(VigilInputError, match="nope.log"):
        next(read_lines(tmp_path / "nope.log"))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=300), max_size=20))
def test_any_text_gets_one_template_per_line(lines: list[str]) -> None:
    miner = TemplateMiner()
    matches = miner.add_block(lines)
    assert len(matches) == len(lines)
    for line, found in zip(lines, matches, strict=True):
        # A line still matches the template it joined: templates only ever generalize.
        again = miner.match(line)
        assert again is not None and again.template_id == found.template_id


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=5000))
def test_any_bytes_parse(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("bytes") / "garbage.log"
    path.write_bytes(data)
    miner = TemplateMiner()
    total = sum(len(miner.add_block(block)) for block in read_lines(path))
    data = data.lstrip(b"\0")  # zeros at a file's start are a copytruncate hole, not a line
    assert total == data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)


def test_one_megabyte_line() -> None:
    miner = TemplateMiner()
    huge = "a1 " * (1 << 19)
    assert miner.add(huge).template_id
    assert miner.add("z" * (1 << 20)).template_id


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab Jul:=.,/()[]-_x0123456789\t")), max_size=80), st.randoms())
def test_numbers_of_any_value_and_width_mask_alike(text: str, rng: random.Random) -> None:
    # The caches key lines by their number-free form; that is only sound if masking agrees.
    redrawn = re.sub(r"\d+", lambda m: str(rng.randrange(1, 10 ** rng.randrange(1, 6))), text)
    if re.search(r"\d", mask(text)) is None:
        assert mask(redrawn) == mask(text)


# VmHWM is the peak RSS of this process image (ru_maxrss would carry the forking parent's over exec).
_STREAM_CHILD = """
import re, sys
from pathlib import Path
from vigil.logs.miner import TemplateMiner, read_lines
miner = TemplateMiner(max_cache=20_000)
for block in read_lines(Path(sys.argv[1])):
    miner.add_templates(block)
peak_kb = int(re.search(r"VmHWM:\\s+(\\d+)", Path("/proc/self/status").read_text()).group(1))
print(peak_kb // 1024, len(miner.templates))
"""


@pytest.mark.slow
def test_streaming_a_generated_log_keeps_memory_flat(tmp_path: Path) -> None:
    # 40 MB of lines whose ids never repeat: without bounds every cache would keep growing.
    path = tmp_path / "big.log"
    kinds = ["worker {} finished step {} in {} ms", "GET /api/v1/items/{} status {} len {}",
             "block blk_{} replicated to 10.0.{}.{}:50010", "session {} opened for uid {} from {}"]
    with path.open("w") as out:
        for i in range(0, 600_000, 1000):
            out.write("".join(kinds[j % 4].format(i + j, j * 7919 % 100_003, (i * j) % 997) + "\n"
                              for j in range(1000)))
    assert path.stat().st_size > 20_000_000
    done = subprocess.run([sys.executable, "-c", _STREAM_CHILD, str(path)], capture_output=True, text=True,
                          check=True, timeout=600)
    peak_mb, templates = map(int, done.stdout.split())
    assert templates == 4
    assert peak_mb < 250  # the interpreter and imports take ~30-70 MB; the miner's state stays small
