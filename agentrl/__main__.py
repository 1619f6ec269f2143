"""`python -m agentrl ...`: the CLI, as launchers (`accelerate launch -m agentrl`, `torchrun -m agentrl`)
start it."""

from agentrl.cli import main

if __name__ == "__main__":
    main()
