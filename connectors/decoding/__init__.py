"""Decoding: raw records in, a canonical Arrow table of valid rows and a dead letter per
refused record out. Every format (JSON events, Parquet/Arrow rows, Criteo TSV lines, and
Kafka polls of those: message_formats, json_fast_path) is first parsed into columns
(parsing), then checked against the FeatureSpec by one column-wise validator (validation,
with sparse_ids for bags of ids and id_bucketing for the rows ids pack as), so that the
rules and the reasons are the same whatever the format. DecodeOptions and the results
each step hands on are in contracts; RecordDecoder (record_decoder) is the one object
callers hold. Nothing is imported here, so that importing one step loads only what it
needs.
"""
