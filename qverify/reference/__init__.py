"""Training the embedded reference model qverify-tiny and its drafter (scripts/train_reference_model.py)."""
