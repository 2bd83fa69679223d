"""Images in chats: decoding (decode.py), each vision family's preprocessing and encoder,
and the pieces that carry an image's embeddings into a prompt."""
