from minillm.bench.cli import main

main()
