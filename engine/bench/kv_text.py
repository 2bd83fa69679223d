"""A fixed English text for the KV-precision measurements (`folio bench kv` and its tests:
teacher-forced KL, greedy replies after a long context): plain prose on several subjects,
written for Folio, about 2,100 tokens of the starter's tokenizer."""

from __future__ import annotations

PARAGRAPHS = (
    "The harbour town woke slowly on the first cold morning of autumn. Fishing boats had "
    "left before dawn, and the only sounds on the quay were the gulls, a delivery van "
    "reversing behind the bakery and the slap of water against the stone steps. Marta "
    "unlocked the door of the small museum at eight, as she had every day for eleven "
    "years, switched on the lights in the long room and checked that the heating had come "
    "on. The museum held the town's memory: nets and floats, a carved figurehead from a "
    "ship that sank in 1887, photographs of women gutting herring on the beach, and a "
    "ledger in which the harbour master had written, in careful brown ink, every vessel "
    "that came and went for forty years.",

    "Visitors were rare in October. A retired couple might come in out of the rain, or a "
    "school class would arrive with worksheets and leave the floor covered in pencil "
    "shavings. Marta did not mind the quiet. She used it to catalogue the boxes that "
    "families brought in when an old house was cleared: letters, postcards, a child's "
    "shoe, a brass compass that no longer pointed north. Each object received a number, a "
    "short description and a note of where it had been found. Her predecessor had kept "
    "the catalogue on index cards; she had moved it to a spreadsheet, and then, after a "
    "long argument with the town council, to a small database that the library shared.",

    "That morning a man in a grey coat was waiting on the bench outside. He introduced "
    "himself as a surveyor from the regional water authority and asked whether the museum "
    "kept any maps of the old drainage channels under the lower town. The authority "
    "planned to replace the pipes along the seafront, and the engineers had found brick "
    "tunnels that appeared on none of their drawings. Marta remembered a roll of "
    "plans in the attic, tied with red tape and labelled in a hand she did not recognise. "
    "She fetched a ladder, climbed into the dust and came down twenty minutes later with "
    "the roll under her arm and cobwebs in her hair.",

    "The plans were drawn on linen, which had survived far better than paper would have. "
    "They showed a network of channels running from the market square down to the "
    "harbour, with small square chambers every fifty yards and arrows marking the "
    "direction of flow. In one corner a note explained that the channels had been built "
    "after the flood of 1853, when the sea came over the wall during a spring tide and "
    "a storm from the north-east arrived together. The surveyor photographed every sheet, "
    "thanked her twice and promised to send the museum a copy of the new survey when the "
    "work was finished.",

    "Cities have always had to decide what to do with water that arrives faster than the "
    "ground can absorb it. Roman engineers built covered sewers that still carry rain "
    "beneath parts of Rome. Medieval towns more often relied on open gutters in the "
    "middle of the street, which worked well enough until the population grew and the "
    "gutters became the easiest place to throw everything else. In the nineteenth "
    "century, cholera outbreaks pushed many governments to build separate systems for "
    "sewage and storm water, and the great brick interceptors of that period are among "
    "the largest structures most residents have never seen.",

    "Modern planners increasingly try to slow water down rather than move it away as "
    "quickly as possible. Green roofs hold rain for hours before releasing it, gravel "
    "car parks let it soak into the soil, and shallow planted ditches along roads filter "
    "out oil and rubber before the water reaches a river. None of these ideas is new. "
    "Farmers have dug ponds and terraces for thousands of years; what has changed is the "
    "willingness of cities to give up valuable land for a basin that stays dry for most "
    "of the year and fills only during the heaviest storms.",

    "The cost of getting this wrong is easy to measure after a flood and hard to argue "
    "for before one. A council that spends money on a retention pond that never "
    "overflows will be asked why it did not build a school instead. A council that saves "
    "the money and then watches the high street go under will be asked why it ignored "
    "the warnings. Engineers who work on drainage often say that their best projects are "
    "the ones nobody notices, because nothing happens.",

    "Learning a musical instrument as an adult is a different experience from learning "
    "it as a child. Children practise because they are told to, and they improve without "
    "understanding why. Adults understand too much: they hear every mistake, compare "
    "themselves with recordings by professionals and lose patience with the slow middle "
    "stage in which practice seems to change nothing. Teachers who work with adult "
    "beginners spend much of their time persuading them that this stage is normal and "
    "that the improvement, when it comes, arrives suddenly after weeks of apparent "
    "stagnation.",

    "The most useful habit, many teachers agree, is to practise slowly. Playing a "
    "difficult passage at half speed, with every note correct, builds the movements that "
    "later become automatic. Playing it at full speed with mistakes builds the mistakes. "
    "A metronome helps, as does recording oneself and listening the next day, when the "
    "memory of what one intended has faded and only the sound remains. Short daily "
    "sessions work better than long weekly ones, because the brain consolidates new "
    "skills during sleep.",

    "Choosing repertoire matters too. A piece that is slightly too hard keeps an adult "
    "learner motivated; a piece that is far too hard leads to frustration and, often, to "
    "giving up altogether. Good teachers keep a list of pieces that sound more difficult "
    "than they are, and they are not embarrassed to recommend simplified arrangements of "
    "famous works. The aim is to make music, not to pass an examination.",

    "In the kitchen, bread is one of the simplest things to make and one of the hardest "
    "to make well. Flour, water, salt and yeast are all it needs, yet the same recipe can "
    "produce a dense brick or a loaf with a crackling crust and an open, glossy crumb. "
    "The difference lies mostly in time and temperature. A dough left to rise slowly in "
    "a cool room develops more flavour than one hurried in a warm oven, because the "
    "yeast and the bacteria in the flour have longer to produce acids and aromatic "
    "compounds.",

    "Hydration, the ratio of water to flour, changes the character of the loaf. A stiff "
    "dough at sixty percent hydration is easy to shape and gives a tight, even crumb, "
    "good for sandwiches. A wet dough at seventy-five percent or more is sticky and "
    "difficult to handle, but it bakes into the irregular holes that many people "
    "associate with artisan bakeries. Bakers handle wet doughs with wet hands, folding "
    "them every half hour during the first rise instead of kneading them on the counter.",

    "Steam in the first minutes of baking keeps the surface of the loaf soft, so that it "
    "can expand before the crust sets. Professional ovens inject steam directly; home "
    "bakers use a covered cast iron pot, or a tray of boiling water on the bottom shelf. "
    "After twenty minutes the lid comes off or the tray is removed, and the dry heat "
    "browns the crust. The loaf is done when it sounds hollow when tapped underneath, "
    "and it should cool for at least an hour before it is cut, however tempting the "
    "smell.",

    "Back in the harbour town, the drainage work began in February. The engineers found "
    "the brick channels exactly where the linen plans had placed them, and they decided "
    "to keep the largest chamber open as a viewing point beneath a glass panel in the "
    "pavement. The council asked the museum to write the text for an information board. "
    "Marta spent a week on two hundred words, cutting and rewriting until every sentence "
    "earned its place. She mentioned the flood of 1853, the unnamed engineer who drew the "
    "plans and the surveyor in the grey coat who had come to ask a simple question.",

    "On the day the panel was unveiled, a small crowd gathered in the drizzle. The mayor "
    "made a short speech, a child pressed her nose against the glass to look into the "
    "dark chamber below, and the local newspaper took a photograph that appeared the "
    "following week beside a report on the price of parking. Afterwards several people "
    "came into the museum for the first time in years. One of them, an elderly man who "
    "had worked on the boats all his life, brought a box of his father's logbooks and "
    "asked whether they might be of any use.",

    "They were. The logbooks recorded weather, catches and prices for every voyage "
    "between 1921 and 1958, and they filled a gap in the museum's records that Marta had "
    "long regretted. She spent the rest of the winter transcribing them, a page or two "
    "each quiet afternoon, and began to notice patterns: the herring arriving later each "
    "decade, the storms clustering in particular years, the prices falling whenever the "
    "railway offered cheaper transport to the cities. By spring she had enough material "
    "for a small exhibition, and she wrote to the regional university to ask whether "
    "anyone there studied the history of the fisheries.",

    "The reply came from a young researcher who was writing a thesis on coastal "
    "communities and the changing sea. She visited in April, stayed for three days in "
    "the guest house above the chandlery and read every logbook twice. At the end of her "
    "visit she explained that the records were valuable for a reason Marta had not "
    "expected: the daily notes on water temperature, taken with the same thermometer "
    "for almost forty years, were among the longest continuous measurements anyone had "
    "found for that stretch of coast. Scientists who model the warming of the ocean "
    "depend on such series, and most of the old ones were lost when fishing families "
    "moved away and their papers were burned or thrown out.",

    "The exhibition opened in June with the logbooks in a glass case, a chart of the "
    "temperatures drawn by a student from the secondary school, and a recording of the "
    "old fisherman describing a winter storm in 1947 that kept the fleet in harbour for "
    "eleven days. More people came on the first weekend than had visited in the whole "
    "previous year. Marta stood by the door and answered questions, and when the last "
    "visitor had gone she sat for a while in the empty room, listening to the gulls and "
    "the water against the steps, before she locked up and walked home along the quay.",
)

TEXT = "\n\n".join(PARAGRAPHS)

# Questions asked after the text for the greedy-reply comparisons.
QUESTIONS = (
    "What did the man in the grey coat want from the museum?",
    "Why do bakers add steam at the start of baking?",
    "What advice do teachers give adult beginners about practice?",
    "How do modern planners try to handle heavy rain?",
    "What did the old fisherman's logbooks record?",
)


def leading_paragraphs(words: int) -> str:
    """The text's first paragraphs, up to at least ``words`` words."""
    out: list[str] = []
    for paragraph in PARAGRAPHS:
        out.append(paragraph)
        if len(" ".join(out).split()) >= words:
            break
    return "\n\n".join(out)
