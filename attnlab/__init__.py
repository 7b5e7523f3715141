"""attnlab's shared library: the config schema, the LSTM/GRU baseline, decoding, optimizers, checkpoints, processes,
a run's record, the comparison of runs, scoring, devices and the GPT-2 bridge. The commands (train.py, sample.py,
scripts/) import it."""
