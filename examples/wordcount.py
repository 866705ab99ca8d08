# Count the words in a text file split over the tiles (run with --data FILE).
words = __tiledata.split()
total = allreduce(len(words), "sum")
if __tileid == 0:
    print(f"{total} words")
