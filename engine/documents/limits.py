"""The limits on an attached file, stated once: what the server's 400, the app's message
and the README quote."""

from __future__ import annotations

MiB = 1 << 20

# The file as it comes (a PDF's or DOCX's bytes, a text file's).
MAX_FILE_BYTES = 32 * MiB
# A DOCX (a zip): what its entries declare they unpack to, all together, and the largest
# ratio of one entry's unpacked to packed size. A zip bomb declares (or, lying, unpacks
# to) far more than either; a real document's XML compresses 5-20 times.
MAX_UNPACKED_BYTES = 128 * MiB
MAX_RATIO = 200
# The extracted text (characters): past this no context holds the document whole, and
# retrieval's index would be the only use of it.
MAX_TEXT_CHARS = 8_000_000
MAX_PDF_PAGES = 5000
