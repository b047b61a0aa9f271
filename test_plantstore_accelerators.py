"""Tests for the accelerators, plantstore_accelerators.py, which make_app installs:
ChunkedStore, the chunked in-memory store, and the usual body's fast read
(`read_usual_new_plant`). Each is held to the core's answers: ChunkedStore to
MemoryStore on the same random sequences of creates, deletes and pages, and the fast
read to the JSON decoder and the NewPlant check on thousands of bodies near the usual
shape, alone and through the whole application. The core's own tests are
test_plantstore.py's."""

import gc
import json
import random

import pytest
import webtest

import plantstore
import plantstore_accelerators
from plantstore import Application, MemoryStore
from plantstore_accelerators import ChunkedStore
from plantstore_app import make_app
from testbed import AUTH, TOKEN, call, listed, stored


@pytest.fixture
def store():
    return ChunkedStore()


def test_application_alone_gets_the_core_s_store_and_no_fast_read():
    """make_app installs the accelerators; Application(tokens) alone is the core's."""
    core = Application([TOKEN])
    assert type(core.store) is MemoryStore
    assert core.plant_reader is plantstore.read_new_plant
    served = make_app([TOKEN])
    assert type(served.store) is ChunkedStore
    assert served.plant_reader is plantstore_accelerators.read_usual_new_plant


# ---- ChunkedStore answers as MemoryStore does ----


def test_plantstore_answers_as_memorystore_on_the_same_sequences():
    """Creates (an id taken answers False), deletes (a missing one answers False) and
    pages from every kind of cursor, on both stores in step: the same answers, seqs
    included, past several chunks, with chunks emptied and ids used again."""
    rng = random.Random(52)
    core, fast = MemoryStore(), ChunkedStore()
    ids = range(3 * plantstore_accelerators.CHUNK)
    for step in range(40_000):
        roll, plant_id = rng.random(), rng.choice(ids)
        if roll < 0.55:
            name, tag = f"p{step}", rng.choice([None, "", "tag"])
            assert core.add(plant_id, name, tag) == fast.add(plant_id, name, tag)
        elif roll < 0.9:
            assert core.delete(plant_id) == fast.delete(plant_id)
        else:
            after = rng.choice([None, -1, step, rng.randrange(-5, 3 * step + 5)])
            limit = rng.choice([0, 1, 7, 1000])
            assert core.page(after, limit) == fast.page(after, limit), (after, limit)
    assert core.page(None, plantstore.INT64_MAX) == fast.page(
        None, plantstore.INT64_MAX
    )
    assert listed(core) == listed(fast) and listed(core, 3) == listed(fast, 3)


def test_plantstore_serves_the_pages_memorystore_serves():
    """Through the application: the same pages and next links, chunk edges included."""
    answers = []
    for store in MemoryStore(), ChunkedStore():
        for plant_id in range(2 * plantstore_accelerators.CHUNK + 5):
            store.add(plant_id, f"p{plant_id}", None)
        for plant_id in range(0, 2 * plantstore_accelerators.CHUNK, 3):
            store.delete(plant_id)
        application = webtest.TestApp(Application([TOKEN], store=store))
        pages, url = [], "/plants?limit=500"
        while url:
            response = application.get(url, headers=AUTH, status=200)
            pages.append(response.json)
            url = response.headers.get("Link", "").partition(">")[0][1:]
        whole = application.get("/plants", headers=AUTH, status=200).json
        answers.append((pages, whole))
    assert answers[0] == answers[1] and len(answers[0][1]) == 2 * 1024 + 5 - 683


def test_stored_plants_give_the_garbage_collector_a_few_objects_per_chunk(store):
    """The collector tracks a handful more objects per CHUNK plants, not one per plant:
    collections come no more often as the store grows (README, "Python versions")."""
    chunks = 16
    names = [
        f"p{i}" for i in range(chunks * plantstore_accelerators.CHUNK)
    ]  # made before counting
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()  # no collection untracks what the adds made: every one is counted
    try:
        tracked = len(gc.get_objects())
        for plant_id, name in enumerate(names):
            assert store.add(plant_id, name, "indoor")
        new_tracked = len(gc.get_objects()) - tracked
    finally:
        if was_enabled:
            gc.enable()
    # each full chunk: a tuple of names and one of tags in place of two lists; one
    # (name, tag) tuple per plant would make it 16,384
    assert new_tracked <= 4 * chunks
    assert stored(store)[len(names) - 1] == (names[-1], "indoor")
    assert listed(store, 1) == [("p0", "indoor")]


def test_a_page_costs_what_it_holds_after_the_oldest_are_deleted(store):
    """Deleting the oldest leaves nothing for a page to walk: chunks with no plant left
    are dropped."""
    for plant_id in range(20_000):
        store.add(plant_id, "", None)  # the empty name too is a plant
    for plant_id in range(18_000):
        store.delete(plant_id)
    # 17 chunks of 1024 emptied
    assert store._names[:17] == [None] * 17 and store._first == 18_000
    assert [seq for seq, _, _ in store.page(None, 3)] == [18_000, 18_001, 18_002]
    # a cursor into the deleted range too
    assert [seq for seq, _, _ in store.page(5, 2)] == [18_000, 18_001]
    assert len(listed(store)) == 2_000 and listed(store, 1) == [("", None)]


# ---- The fast read of the usual body answers as the JSON decoder does ----


def full_reading(text):
    """What the JSON decoder and the shape check make of text: (id, name, tag) or the
    400 message."""
    try:
        return plantstore.parse_new_plant(plantstore.decode_json(text))
    except plantstore.HTTPError as error:
        return error.message


def reading(read, body):
    """What a reader makes of the body's bytes: (id, name, tag) or the 400 message."""
    try:
        return read(body)
    except plantstore.HTTPError as error:
        return error.message


def random_bodies(count, seed=2026):
    """Bodies near the usual shape: odd whitespace, escapes, orders, numbers, and
    breakage."""
    rng = random.Random(seed)
    whitespace = ["", " ", "\t", "\n", "\r\n", "\x0b", "\x0c", "\u00a0", "\u2028"]
    ids = [
        "0",
        "-0",
        "7",
        "-7",
        "01",
        "1.0",
        "1e3",
        "9223372036854775807",
        "9223372036854775808",
        "-9223372036854775808",
        "-9223372036854775809",
        "99999999999999999999",
        "true",
        '"7"',
        "null",
    ]
    strings = [
        '""',
        '"Fern"',
        '"caf\u00e9"',
        '"\ud83c\udf3f"',
        '"a\\"b"',
        '"\\u0041"',
        '"tab\there"',
        '"\x7f"',
        '"\x1f"',
        '"slash/\\/"',
        "5",
        "null",
        '"\ud800"',
    ]

    def pick(odd, usual):
        return rng.choice(odd) if rng.random() < 0.1 else usual

    def ws(usual=""):
        return pick(whitespace, usual)

    def plant_id():
        return pick(ids, str(rng.randint(-(10**6), 10**6)))

    def string():
        return pick(
            strings, '"' + "".join(rng.choices("aZ 9-é🌿", k=rng.randint(0, 8))) + '"'
        )

    for _ in range(count):
        # after ':' and ',': compact, or as json.dumps() writes it
        gap = rng.choice(["", " "])
        fields = [
            f'"id"{ws()}:{ws(gap)}{plant_id()}',
            f'"name"{ws()}:{ws(gap)}{string()}',
        ]
        if rng.random() < 0.6:
            fields.append(f'"tag"{ws()}:{ws(gap)}{string()}')
        if rng.random() < 0.2:
            rng.shuffle(fields)
        if rng.random() < 0.1:
            fields.append(rng.choice(fields))  # a duplicate key
        text = ws() + "{" + ws() + f"{ws()},{ws(gap)}".join(fields) + ws() + "}" + ws()
        if rng.random() < 0.1:
            text = text.replace(rng.choice(["{", "}", ",", ":", '"']), "", 1)
        yield text


def test_fast_path_reads_exactly_what_the_json_decoder_reads():
    """The fast read answers as the core's reader on every body, bytes that are not
    UTF-8 included, and as the decoder on the text of each; both paths are met."""
    matched, rng = 0, random.Random(7)
    for text in random_bodies(5000):
        body = text.encode("utf-8", "surrogatepass")
        if rng.random() < 0.05:  # bytes that are no UTF-8, in the usual shape or not
            body = body.replace(b"e", b"\xe9", 1)
        fast = reading(plantstore_accelerators.read_usual_new_plant, body)
        assert fast == reading(plantstore.read_new_plant, body), body
        assert fast == full_reading(text) or "UTF-8" in fast, text
        matched += plantstore_accelerators._USUAL_NEWPLANT.fullmatch(text) is not None
    assert 500 < matched < 4500, matched  # both paths were exercised


def test_make_app_answers_every_body_as_the_core_does():
    """The same bodies through the whole application, make_app's (ChunkedStore, the fast
    read) and the core's: the same status, body and headers but the request id."""
    apps = make_app([TOKEN]), Application([TOKEN])
    for text in random_bodies(1500, seed=53):
        body = text.encode("utf-8", "surrogatepass")
        answers = []
        for application in apps:
            status, headers, answer = call(application, body=body)
            answers.append((status, headers, json.dumps(answer)))
        assert answers[0] == answers[1], text
