"""Research reporting for the claim notebooks (not part of the library): reading finished runs
back (analysis.py) and a claim's verdict from its registry entry (verdicts.py). The notebooks run
in this folder's parent and import it as ``reporting``; tests put notebooks/ on sys.path."""
