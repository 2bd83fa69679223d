"""Tool calling: how each model family writes a call, and reading calls out of a reply.

``format.py`` says what a family's call looks like (``ToolFormat``), one module per family
format (``hermes.py`` for Qwen 2.5 / Qwen 3, ``llama3.py``, ``mistral.py``, ``phi4.py``),
and ``registry.py`` is the one table from a model family to its format. ``parser.py`` reads
a reply as it streams into text and call events (``events.py``), ``calls.py`` reads the
JSON of a call, and ``template.py`` gets tools, calls and results into a chat template.
Nothing here constrains what a model writes: that is structured output's job.
"""
