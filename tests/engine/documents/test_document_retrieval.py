"""Retrieval for documents too long for the context: passages never cross a page, and on
a generated 60-page PDF with 20 planted facts BM25 (SQLite FTS5) puts the page holding
each fact in its top 5 for at least 18 of the 20 questions."""

from __future__ import annotations

import random

from engine.bench.pdf_writer import write_pdf
from engine.documents import Document, DocumentIndex, Section, chunk_document, extract
from engine.documents.chunks import TARGET_CHARS

# Words of an operations manual, none of them a fact's own.
FILLER = """system process team review report quarter budget plan schedule project update
meeting policy procedure staff office customer service quality standard control record
account request approval document section note item list figure table summary result
level rate period cost value change issue risk safety training support contract vendor
supply order stock delivery shipment invoice payment balance audit check test measure
target goal progress status owner manager department unit site area region network
access user device software hardware data file folder backup storage server room floor
building entry exit door window light power cable panel switch sensor alarm camera
monitor display screen printer paper desk chair cabinet shelf box label form field
code number date time week month year day morning evening shift hour minute""".split()

# (the planted sentence, the question asked of it)
FACTS = [
    ("The emergency generator in the east annex is refuelled every ninth Thursday.",
     "How often is the emergency generator in the east annex refuelled?"),
    ("Forklift licences are renewed by Margarethe Olsen in the logistics bureau.",
     "Who renews forklift licences?"),
    ("The chlorine dosing pump runs at 3.2 litres per hour in winter.",
     "At what rate does the chlorine dosing pump run in winter?"),
    ("Visitors to the cleanroom must wear blue bootcovers and a hairnet.",
     "What must visitors to the cleanroom wear?"),
    ("The pension scheme matches contributions up to seven percent of salary.",
     "Up to what share of salary does the pension scheme match contributions?"),
    ("Our Lisbon warehouse stocks spare impellers for the centrifugal compressors.",
     "Which warehouse stocks spare impellers for the compressors?"),
    ("The fire assembly point is the car park beside the sculpture garden.",
     "Where is the fire assembly point?"),
    ("Laboratory glassware is autoclaved at 121 degrees for twenty minutes.",
     "How is laboratory glassware autoclaved?"),
    ("The cafeteria serves vegetarian lasagne on Wednesdays.",
     "Which day does the cafeteria serve vegetarian lasagne?"),
    ("Parking permits for bicycles are issued by the reception desk in Tower B.",
     "Who issues bicycle parking permits?"),
    ("The telescope mirror was recoated with aluminium in March.",
     "When was the telescope mirror recoated?"),
    ("Sourdough starter for the bakery line is fed with rye flour twice daily.",
     "What is the bakery's sourdough starter fed with?"),
    ("The orchestra rehearses Mahler's fifth symphony in the west auditorium.",
     "Which symphony does the orchestra rehearse?"),
    ("Beekeepers inspect the rooftop hives for varroa mites each fortnight.",
     "How often are the rooftop hives inspected for varroa mites?"),
    ("The ferry to Helgoland leaves the harbour pier at quarter past six.",
     "When does the ferry to Helgoland leave?"),
    ("Quarantined seedlings are kept in greenhouse twelve under sodium lamps.",
     "Where are quarantined seedlings kept?"),
    ("The vintage typewriter collection is insured for eighty thousand euros.",
     "For how much is the typewriter collection insured?"),
    ("Turbine blade cracks are found with ultrasonic phased-array probes.",
     "How are turbine blade cracks found?"),
    ("The choir's tenor section is led by Ignatius Fairweather.",
     "Who leads the choir's tenor section?"),
    ("Saltwater aquarium filters are rinsed with dechlorinated water on Sundays.",
     "What are the saltwater aquarium filters rinsed with?"),
]


def manual(pages: int = 60, lines: int = 40, seed: int = 0) -> tuple[bytes, list[int]]:
    """A PDF of ``pages`` pages of filler with each fact on a page of its own; returns the
    file and each fact's page (1-based)."""
    rng = random.Random(seed)
    text = [[" ".join(rng.choice(FILLER) for _ in range(rng.randint(8, 13))).capitalize()
             + "." for _ in range(lines)] for _ in range(pages)]
    where = rng.sample(range(pages), len(FACTS))
    for (fact, _), page in zip(FACTS, where, strict=True):
        text[page][rng.randrange(lines)] = fact
    return write_pdf(text), [p + 1 for p in where]


def test_the_page_of_each_planted_fact_is_in_the_top_five():
    pdf, pages = manual()
    index = DocumentIndex(extract(pdf, "manual.pdf"))
    found = [f"page {page}" in [c.anchor for c in index.search(question, 5)]
             for (_, question), page in zip(FACTS, pages, strict=True)]
    assert sum(found) >= 18, [q for (_, q), ok in zip(FACTS, found, strict=True) if not ok]


def test_passages_keep_to_their_page_and_paragraphs():
    long_page = "\n\n".join(f"Paragraph {i} " + "word " * 60 for i in range(8))
    doc = Document("d.md", "0" * 64, "markdown",
                   (Section("page 1", "short page"), Section("page 2", long_page)))
    chunks = chunk_document(doc)
    assert chunks[0].anchor == "page 1" and chunks[0].text == "short page"
    rest = chunks[1:]
    assert {c.anchor for c in rest} == {"page 2"} and len(rest) > 1
    assert all(len(c.text) <= TARGET_CHARS for c in rest)
    # Paragraphs are whole: each passage starts at one.
    assert all(c.text.startswith("Paragraph ") for c in rest)
    assert [c.index for c in chunks] == list(range(len(chunks)))


def test_a_question_with_no_word_in_the_document_finds_nothing():
    index = DocumentIndex(Document("d.txt", "0" * 64, "text", (Section("", "alpha beta"),)))
    assert index.search("gamma?") == [] and index.search("???") == []
    assert [c.text for c in index.search('"beta" OR x*')] == ["alpha beta"]
