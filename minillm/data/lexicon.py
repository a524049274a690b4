"""The words the story grammar is made of.

Every word a story can contain is listed here, grouped into categories ("a sad feeling", "a hiding
spot"). Sentence templates (in `templates.py`) name a category wherever a word can vary, so this file
is, together with the templates, the whole language of the corpus: a few hundred words in all.
"""

# Heroes and their friends take names from different lists, so a story never has two characters of one
# name, and the checker can tell a hero's line from a friend's ("What is wrong, Mia?" asked Kate).
HERO_GIRLS = [
    "Mia",
    "Lily",
    "Emma",
    "Anna",
    "Sara",
    "Zoe",
    "Ruby",
    "Ella",
    "Nora",
    "Lucy",
    "Rosa",
    "Maya",
    "Ivy",
    "Lena",
]
HERO_BOYS = ["Tom", "Ben", "Sam", "Leo", "Max", "Jack", "Finn", "Noah", "Eli", "Owen", "Jake", "Luke", "Tim", "Dan"]
FRIEND_GIRLS = ["Kate", "Amy", "Jane", "Tina", "Grace", "Hannah", "Molly", "Daisy", "Alice", "Clara"]
FRIEND_BOYS = ["Oscar", "Peter", "Henry", "Felix", "Hugo", "Ryan", "Toby", "Oliver", "Charlie", "George"]
GIRL_NAMES = HERO_GIRLS + FRIEND_GIRLS

# What a character is. A girl is "she" and a boy is "he"; an animal may be either.
KINDS = {
    "girl": "f",
    "boy": "m",
    "bunny": None,
    "puppy": None,
    "kitten": None,
    "bear": None,
    "fox": None,
    "duck": None,
    "mouse": None,
    "frog": None,
    "squirrel": None,
    "owl": None,
}

PRONOUNS = {
    "f": {"he": "she", "He": "She", "him": "her", "his": "her", "His": "Her", "himself": "herself"},
    "m": {"he": "he", "He": "He", "him": "him", "his": "his", "His": "His", "himself": "himself"},
}

COLORS = ["red", "blue", "green", "yellow", "pink", "purple", "orange", "white"]
TOY_ADJECTIVES = COLORS + ["shiny", "old", "new", "little", "big", "soft"]
TOYS = [
    "ball",
    "hat",
    "book",
    "doll",
    "boat",
    "drum",
    "box",
    "shell",
    "scarf",
    "ring",
    "bell",
    "blanket",
    "wagon",
    "whistle",
    "robot",
    "train",
    "teddy bear",
    "toy car",
]
FLYERS = ["kite", "balloon"]
TREATS = ["cookie", "sandwich", "muffin", "cupcake", "cheese roll", "jam tart", "honey cake"]
FRUITS = ["apple", "banana", "pear", "orange", "plum", "peach", "carrot"]

# place -> the little word that goes before it ("in the park", "at the beach").
PLACES = {
    "park": "in",
    "forest": "in",
    "garden": "in",
    "meadow": "in",
    "village": "in",
    "woods": "in",
    "beach": "at",
    "lake": "at",
    "farm": "on",
    "hill": "on",
    "river": "by",
    "pond": "by",
}

# young animal -> its mother.
CRITTERS = {
    "baby bird": "mother bird",
    "little kitten": "mother cat",
    "baby duck": "mother duck",
    "little puppy": "mother dog",
    "baby rabbit": "mother rabbit",
    "little lamb": "mother sheep",
    "baby fox": "mother fox",
    "baby owl": "mother owl",
}

# Free categories: a template slot named after one of these takes any word of the list, anew each time.
CATEGORIES = {
    "trait": [
        "little",
        "kind",
        "brave",
        "happy",
        "curious",
        "shy",
        "clever",
        "small",
        "silly",
        "gentle",
        "friendly",
        "funny",
        "quiet",
        "young",
        "busy",
        "cheerful",
    ],
    "sad": ["sad", "upset", "worried", "unhappy", "lonely"],
    "happy": ["happy", "glad", "excited", "proud", "thankful", "joyful"],
    "daytime": [
        "morning",
        "day",
        "afternoon",
        "evening",
        "sunny morning",
        "bright morning",
        "summer afternoon",
        "spring morning",
        "warm day",
        "fine day",
    ],
    "home": [
        "in a small house by the sea",
        "in a little house near the woods",
        "on a big farm",
        "in a cozy den under a tree",
        "in a busy town",
        "in a tiny house with a red door",
        "in a quiet village",
        "in a house on a green hill",
    ],
    "hobby": [
        "play outside",
        "sing songs",
        "draw pictures",
        "read books",
        "pick flowers",
        "run and jump",
        "dance in the sun",
        "look at the stars",
        "build tall towers",
        "play games",
        "splash in puddles",
        "climb trees",
    ],
    "spot": [
        "under the bed",
        "behind the tree",
        "in the tall grass",
        "under a big rock",
        "inside the old barn",
        "behind the door",
        "under the table",
        "near the fence",
        "in a bush",
        "under the bridge",
        "next to the pond",
        "in the sand",
        "behind a box",
        "under some leaves",
        "on a high shelf",
    ],
    "nook": [
        "behind a tree",
        "in the tall grass",
        "under a big rock",
        "in a bush",
        "under the bridge",
        "next to the pond",
        "under some leaves",
        "near the fence",
        "inside the old barn",
        "by a log",
    ],
    "junk": [
        "an old sock",
        "a little bug",
        "a dry leaf",
        "a muddy stone",
        "a sleepy cat",
        "a broken cup",
        "a spider web",
        "a lost button",
        "a pine cone",
    ],
    "dare": [
        "swim in the lake",
        "go down the big slide",
        "climb the tall hill",
        "jump over the stream",
        "cross the old bridge",
        "sing in front of everyone",
        "ride the big pony",
        "dive into the pool",
        "walk in the dark garden",
        "climb the big tree",
    ],
    "helper": ["squirrel", "bird", "monkey", "cat", "owl", "goat"],
    "weather": [
        "The sun was warm and the birds were singing",
        "The sky was blue and the grass was green",
        "It was a bright and sunny day",
        "The wind was soft and cool",
        "The flowers were open and the bees were busy",
        "Little clouds floated in the sky",
    ],
}


def article(phrase: str) -> str:
    """'a' or 'an' + phrase, chosen by the first letter (good enough for this vocabulary)."""
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase
