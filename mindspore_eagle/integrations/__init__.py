"""Optional integrations with other MindSpore tooling.

``mindformers_adapter``  MindFormers registration (YAML ``build_model``, ``AutoModelForCausalLM``, ``pipeline``);
                         needs the ``mindformers`` extra, in its own environment (MindFormers 1.9 pins
                         MindSpore 2.9): ``make test-mindformers`` builds it. Import the submodule explicitly;
                         importing this package never imports MindFormers.
"""
