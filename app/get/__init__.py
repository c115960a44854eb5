"""``ferry get``: know before downloading whether a model fits and how fast it
will run, then download it from a Hugging Face hub (or a mirror: HF_ENDPOINT)
and convert it while it downloads, resumably. No Qt here; the wizard's
download page drives the same objects. Nothing in this package touches the
network unless a plan or a download is asked for."""
