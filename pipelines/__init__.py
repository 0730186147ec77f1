"""Beam transforms (PackFeatures, PicassoTrain, ...) and the runnable pipelines.

Importing it does nothing else: what a process that runs picasso needs set up is done
where that process starts, explicitly.
- The `picasso` command's exit handler (cli/process_exit.py: registered before those of the
  modules picasso loads) is registered first thing in the command line's package
  (cli/__init__.py), which every entry of the command imports before anything else.
- picasso's URLs (picasso.storage) are served through Beam's filesystems by the command
  (cli/main.py), the pipelines' drivers and, on Beam's workers, each step that reads or
  writes one: connectors/beam_urls.py lists where.
"""
