"""Tests for the fast path for the usual body of plantstore.py (`_USUAL_NEWPLANT`,
`read_new_plant`), which reads {"id": 7, "name": "Fern", "tag": "indoor"} as JSON
libraries write it without the JSON decoder: on 5,000 bodies near that shape it reads
exactly what the decoder and the NewPlant check read. It is to move below the banner, an
optional accelerator; the core's own reading of a body (strict JSON, then NewPlant) is
test_plantstore.py's."""

import random

import plantstore


# ---- The fast path for the usual body agrees with the JSON decoder ----


def full_reading(text):
    """What the JSON decoder and the shape check make of text: (id, name, tag) or the
    400 message."""
    try:
        return plantstore.parse_new_plant(plantstore.decode_json(text))
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
    matched = 0
    for text in random_bodies(5000):
        usual = plantstore._USUAL_NEWPLANT.fullmatch(text)
        try:
            fast = plantstore.read_new_plant(text.encode("utf-8", "surrogatepass"))
        except plantstore.HTTPError as error:
            fast = error.message
        assert fast == full_reading(text) or "UTF-8" in fast, text
        matched += usual is not None
    assert 500 < matched < 4500, matched  # both paths were exercised
