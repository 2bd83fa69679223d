"""A tiny PDF writer for ``folio bench documents`` and the document tests: pages of
Helvetica text lines (text known in advance), a page with only a drawing (no text layer),
and the standard security handler's RC4 encryption (revision 2, 40-bit) with a user
password, so every PDF the bench and the tests read is written, none shipped."""

from __future__ import annotations

import hashlib

# The standard security handler's password padding (PDF 1.7, 7.6.3.3).
_PAD = bytes.fromhex("28BF4E5E4E758A4164004E56FFFA01082E2E00B6D0683E802F0CA9FE6453697A")
_FILE_ID = bytes(range(16))


def _rc4(key: bytes, data: bytes) -> bytes:
    s = list(range(256))
    j = 0
    for i in range(256):
        j = (j + s[i] + key[i % len(key)]) % 256
        s[i], s[j] = s[j], s[i]
    out = bytearray()
    i = j = 0
    for byte in data:
        i = (i + 1) % 256
        j = (j + s[i]) % 256
        s[i], s[j] = s[j], s[i]
        out.append(byte ^ s[(s[i] + s[j]) % 256])
    return bytes(out)


def _padded(password: str) -> bytes:
    return (password.encode("latin-1") + _PAD)[:32]


class _Encryption:
    """Revision 2: a 5-byte file key from the user password, each object's strings and
    streams RC4'd with a key made from it and the object's number."""

    PERMISSIONS = -4  # everything allowed; the password is what stops a reader

    def __init__(self, user_password: str, owner_password: str) -> None:
        owner_key = hashlib.md5(_padded(owner_password)).digest()[:5]
        self.owner = _rc4(owner_key, _padded(user_password))
        permissions = (self.PERMISSIONS & 0xFFFFFFFF).to_bytes(4, "little")
        self.key = hashlib.md5(_padded(user_password) + self.owner + permissions
                               + _FILE_ID).digest()[:5]
        self.user = _rc4(self.key, _PAD)

    def crypt(self, number: int, data: bytes) -> bytes:
        key = hashlib.md5(self.key + number.to_bytes(3, "little") + b"\0\0").digest()[:10]
        return _rc4(key, data)

    def dictionary(self) -> bytes:
        return (b"<< /Filter /Standard /V 1 /R 2 /O <" + self.owner.hex().encode()
                + b"> /U <" + self.user.hex().encode() + b"> /P "
                + str(self.PERMISSIONS).encode() + b" >>")


def _escape(text: str) -> bytes:
    raw = text.encode("cp1252")
    return raw.replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)")


def _page_stream(lines: list[str]) -> bytes:
    """Lines from the top of a Letter page down, 14 points apart; an empty page draws a
    filled rectangle instead (a scan's page: marks, no text)."""
    if not lines:
        return b"0.5 g 72 72 468 648 re f"
    out = [b"BT /F1 11 Tf 14 TL 72 720 Td"]
    for line in lines:
        out.append(b"(" + _escape(line) + b") Tj T*")
    out.append(b"ET")
    return b"\n".join(out)


def write_pdf(pages: list[list[str]], user_password: str | None = None) -> bytes:
    """A PDF of ``pages`` (each a list of text lines; an empty list: a page with a drawing
    and no text), encrypted when ``user_password`` is given."""
    crypt = _Encryption(user_password, "owner") if user_password is not None else None
    objects: list[bytes] = []  # object i + 1

    def add(body: bytes) -> int:
        objects.append(body)
        return len(objects)

    catalog = add(b"")  # filled in once the page tree's number is known
    font = add(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica "
               b"/Encoding /WinAnsiEncoding >>")
    tree = add(b"")
    kids = []
    for lines in pages:
        stream = _page_stream(lines)
        number = len(objects) + 1
        if crypt is not None:
            stream = crypt.crypt(number, stream)
        content = add(b"<< /Length " + str(len(stream)).encode() + b" >>\nstream\n"
                      + stream + b"\nendstream")
        kids.append(add(b"<< /Type /Page /Parent " + str(tree).encode()
                        + b" 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 "
                        + str(font).encode() + b" 0 R >> >> /Contents "
                        + str(content).encode() + b" 0 R >>"))
    objects[catalog - 1] = b"<< /Type /Catalog /Pages " + str(tree).encode() + b" 0 R >>"
    objects[tree - 1] = (b"<< /Type /Pages /Kids [" + b" ".join(f"{k} 0 R".encode()
                                                             for k in kids)
                         + b"] /Count " + str(len(kids)).encode() + b" >>")
    encrypt = add(crypt.dictionary()) if crypt is not None else None

    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for i, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    for offset in offsets:
        out += f"{offset:010d} 00000 n \n".encode()
    trailer = f"<< /Size {len(objects) + 1} /Root {catalog} 0 R /ID [<{_FILE_ID.hex()}> " \
              f"<{_FILE_ID.hex()}>]"
    if encrypt is not None:
        trailer += f" /Encrypt {encrypt} 0 R"
    out += f"trailer\n{trailer} >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)
