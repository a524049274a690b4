"""The stories' plots: each plot is a list of beats, each beat a handful of sentence templates.

Every story follows the same arc - setting, problem, attempt, resolution, ending - through one of
five plots (a lost toy, a kite stuck in a tree, being brave, sharing a picnic, rescuing a baby animal).
A beat happens with probability `p`, up to `most` times with different templates, so two stories with
the same plot still read differently. Slots are explained in `grammar.py`.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Beat:
    templates: tuple[str, ...]
    p: float = 1.0  # chance that the beat happens at all
    most: int = 1  # it may happen up to this many times, each time with a different template


def beat(*templates: str, p: float = 1.0, most: int = 1) -> Beat:
    return Beat(templates, p, most)


INTRO = beat(
    "Once upon a time, there was a {hero.trait} {hero.kind} named {hero}.",
    "There once was a {hero.trait} {hero.kind} named {hero} who lived {home}.",
    "{hero} was a {hero.trait} {hero.kind} who lived {home}.",
    "Once upon a time, {home}, there lived a {hero.trait} {hero.kind} named {hero}.",
)
HOBBY = beat(
    "{hero.He} loved to {hobby}.",
    "Every day, {hero.he} liked to {hobby}.",
    "More than anything, {hero} loved to {hobby}.",
    p=0.7,
)
BEST_FRIEND = beat(
    "{hero}'s best friend was a {friend.trait} {friend.kind} named {friend}.",
    "{hero.He} had a good friend named {friend}.",
    p=0.5,
)
DAY = beat(
    "One {daytime}, {hero} went to the {place}.",
    "One {daytime}, {hero} was playing {place.at}.",
)
WEATHER = beat("{weather}.", p=0.5)
JOY = beat(
    "{hero} was so {happy}.",
    "{hero.He} jumped up and down with joy.",
    "{hero} felt warm and {happy} inside.",
    p=0.9,
)
THANKS = beat(
    "\"Thank you, {friend}!\" said {hero}.",
    "\"You are a good friend,\" said {hero}.",
    "\"Thank you for helping me,\" said {hero}.",
    p=0.9,
)
ENDING = beat(
    "From that day on, {hero} and {friend} were best friends.",
    "{hero} and {friend} played together until the sun went down.",
    "That night, {hero} went to bed with a big smile.",
    "It was the best day ever.",
)


def moral(*lessons: str) -> Beat:
    return beat(*(f"{{hero}} learned that {lesson}." for lesson in lessons), p=0.5)


THE_END = beat("The end.", p=0.3)

LOST_TOY = [
    INTRO,
    HOBBY,
    BEST_FRIEND,
    beat(
        "{hero.He} had {thing.a} that {hero.he} loved very much.",
        "{hero}'s favorite toy was {hero.his} {thing}.",
        "{hero.His} grandma had given {hero.him} {thing.a} for {hero.his} birthday.",
        "{hero.He} took {hero.his} {thing} everywhere {hero.he} went.",
    ),
    DAY,
    WEATHER,
    beat(
        "But when {hero.he} looked for {hero.his} {thing.noun}, it was gone!",
        "Suddenly, {hero} could not find {hero.his} {thing}.",
        "After a while, {hero} saw that {hero.his} {thing.noun} was missing.",
    ),
    beat(
        "{hero} felt very {sad}.",
        "{hero.He} was so {sad} that {hero.he} began to cry.",
        "\"Oh no, where is my {thing.noun}?\" cried {hero}.",
        p=0.8,
    ),
    beat(
        "Just then, {hero.his} friend {friend} came by.",
        "Soon, {friend}, a {friend.trait} {friend.kind}, came over to play.",
        "A {friend.trait} {friend.kind} named {friend} saw {hero} and came over.",
    ),
    beat(
        "\"What is wrong, {hero}?\" asked {friend}.",
        "\"Why are you so {sad}?\" asked {friend}.",
        "\"Can I help you?\" asked {friend}.",
        p=0.9,
    ),
    beat(
        "\"I lost my {thing},\" said {hero}.",
        "\"I can't find my {thing.noun} anywhere!\" cried {hero}.",
        "{hero} told {friend} about the lost {thing.noun}.",
        p=0.9,
    ),
    beat(
        "\"Don't worry, I will help you look for it,\" said {friend}.",
        "\"Let's look for it together,\" said {friend}.",
        "{friend} wanted to help {friend.his} friend.",
    ),
    beat(
        "They looked {spot}, but the {thing.noun} was not there.",
        "{hero} looked {spot}, but {hero.he} only found {junk}.",
        "{friend} looked {spot}, but there was only {junk}.",
        "Then they looked {spot}.",
        "They searched all over the {place}.",
        most=3,
    ),
    beat(
        "At last, {friend} found the {thing} {spot}!",
        "Finally, they found the {thing.noun} {spot}.",
        "Then {hero} saw the {thing.noun} {spot}, just where {hero.he} had left it.",
    ),
    beat("{hero} hugged {hero.his} {thing.noun} and smiled.", p=0.5),
    JOY,
    THANKS,
    ENDING,
    moral("friends help each other", "it is good to ask for help"),
    THE_END,
]

STUCK_KITE = [
    INTRO,
    HOBBY,
    beat("{hero.He} had {flyer.a} that could fly very high.", "{hero.His} dad had bought {hero.him} {flyer.a}."),
    DAY,
    WEATHER,
    beat(
        "The wind was strong, and the {flyer.noun} went up high.",
        "The {flyer.noun} flew higher and higher.",
        "{hero} laughed as the {flyer.noun} danced in the wind.",
    ),
    beat(
        "Suddenly, a big wind pulled the {flyer.noun} into a tall tree.",
        "Then the {flyer.noun} got stuck in the branches of a big tree.",
    ),
    beat(
        "{hero} tried to reach it, but the tree was too tall.",
        "{hero.He} jumped and jumped, but {hero.he} could not reach it.",
        "{hero.He} pulled the string, but the {flyer.noun} did not move.",
        most=2,
    ),
    beat("\"Help, my {flyer.noun} is stuck!\" cried {hero}.", "{hero} felt {sad} and began to cry.", p=0.9),
    beat("A {trait} {helper} named {friend} heard {hero.him}.", "Just then, {friend} the {helper} came by."),
    beat("\"Don't be sad, I can climb the tree,\" said {friend}.", "\"I can help you,\" said {friend}."),
    beat(
        "{friend} climbed up the tree and got the {flyer.noun}.",
        "{friend} went up, up, up and pulled the {flyer.noun} free.",
        "Slowly and carefully, {friend} brought the {flyer.noun} down.",
    ),
    beat("{friend} gave the {flyer} back to {hero}.", p=0.8),
    JOY,
    THANKS,
    beat("Then {hero} and {friend} flew the {flyer.noun} together.", p=0.5),
    ENDING,
    moral("it is good to ask for help", "a good friend is a great gift"),
    THE_END,
]

BRAVE = [
    INTRO,
    HOBBY,
    BEST_FRIEND,
    DAY,
    WEATHER,
    beat(
        "{hero} wanted to {dare}, but {hero.he} was scared.",
        "All of {hero.his} friends could {dare}, but {hero} was afraid.",
        "{hero} wished {hero.he} could {dare}, but it looked so scary.",
    ),
    beat(
        "Every time {hero.he} tried, {hero.his} legs began to shake.",
        "{hero.His} heart went thump, thump, thump.",
        "{hero.He} wanted to run away and hide.",
        p=0.8,
    ),
    beat(
        "\"I am too scared,\" said {hero}.",
        "\"What if I fall?\" asked {hero}.",
        "\"I can't do it,\" whispered {hero}.",
        p=0.9,
    ),
    beat(
        "{hero.His} friend {friend} sat down next to {hero.him}.",
        "Then {friend}, a {friend.trait} {friend.kind}, came to see {hero}.",
    ),
    beat(
        "\"You can do it, {hero}!\" said {friend}.",
        "\"I will stay right here with you,\" said {friend}.",
        "\"Let's do it together,\" said {friend}.",
        "\"Everyone is scared sometimes,\" said {friend}.",
        "{friend} held {hero}'s hand.",
        most=2,
    ),
    beat(
        "{hero} took a deep breath.",
        "{hero.He} counted to three.",
        "Slowly, {hero} began to {dare}.",
        "At first it was hard, but {hero.he} did not give up.",
        most=2,
    ),
    beat("And {hero.he} did it!", "Soon {hero} was not scared anymore.", "It was not so scary after all."),
    beat("\"I did it!\" shouted {hero}.", "{friend} clapped and cheered for {hero.him}.", p=0.8),
    JOY,
    ENDING,
    moral("it is good to be brave", "you should never give up"),
    THE_END,
]

PICNIC = [
    INTRO,
    HOBBY,
    BEST_FRIEND,
    beat("One {daytime}, {hero} had a picnic {place.at}."),
    WEATHER,
    beat(
        "{hero.His} mom had packed {food.a} and {fruit.a} for {hero.him}.",
        "{hero.He} sat down on a soft blanket under a tree.",
        "{hero.He} was very hungry and could not wait to eat.",
        most=2,
    ),
    beat(
        "Then {hero.he} saw {friend} sitting all alone.",
        "Just then, {friend}, a {friend.trait} {friend.kind}, walked by.",
    ),
    beat(
        "{friend} had nothing to eat.",
        "{friend} looked very {sad}.",
        "{friend.His} tummy was making loud noises.",
        most=2,
    ),
    beat("\"Are you hungry, {friend}?\" asked {hero}.", "\"Where is your lunch?\" asked {hero}.", p=0.9),
    beat(
        "\"I forgot my lunch at home,\" said {friend}.",
        "\"I have no food today,\" said {friend} in a small voice.",
        p=0.9,
    ),
    beat(
        "{hero} looked at {hero.his} {food}.",
        "{hero.He} wanted to eat it all by {hero.himself}.",
        "But then {hero.he} thought about how {friend} felt.",
        p=0.8,
        most=2,
    ),
    beat(
        "\"You can have half of my {food},\" said {hero}.",
        "{hero} gave {friend} half of {hero.his} {food}.",
        "{hero} gave {hero.his} {fruit} to {friend}.",
    ),
    beat(
        "{friend} smiled a big smile.",
        "They ate the {food} together {place.at}.",
        "It tasted even better because they shared it.",
        "Sharing made them both {happy}.",
        most=2,
    ),
    beat("\"Thank you, {hero}!\" said {friend}.", "\"You are a good friend,\" said {friend}.", p=0.9),
    ENDING,
    moral("sharing makes everyone happy", "being kind is the best thing"),
    THE_END,
]

RESCUE = [
    INTRO,
    HOBBY,
    beat("One {daytime}, {hero} was walking {place.at}."),
    WEATHER,
    beat(
        "Suddenly, {hero.he} heard a small sound {nook}.",
        "There, {nook}, was {critter.a}.",
        "{hero.He} saw {critter.a} {nook}.",
    ),
    beat(
        "The {critter} was lost and could not find its mom.",
        "The {critter} was cold and scared.",
        "The poor {critter} was crying for its mom.",
    ),
    beat("\"Don't be scared, little one,\" said {hero}.", "\"I will help you find your mom,\" said {hero}.", p=0.9),
    beat(
        "{hero} picked up the {critter} very gently.",
        "{hero.He} held it close to keep it warm.",
        "{hero.He} wrapped it in {hero.his} soft scarf.",
        most=2,
    ),
    beat(
        "{hero} walked all over the {place}.",
        "{hero.He} looked {nook}.",
        "{hero.He} asked {friend} the {helper} for help.",
        "\"Have you seen the {critter.mom}?\" asked {hero}.",
        most=2,
    ),
    beat("At last, {hero.he} saw the {critter.mom} {nook}.", "Then the {critter.mom} came to them."),
    beat(
        "The {critter.mom} was so happy to see her baby.",
        "The {critter} ran to its mom.",
        "The {critter.mom} thanked {hero} with a big smile.",
        most=2,
    ),
    JOY,
    beat(
        "That night, {hero} went to bed with a big smile.",
        "It was the best day ever.",
        "{hero} never forgot the {critter}.",
    ),
    moral("it is good to help others", "being kind is the best thing"),
    THE_END,
]

PLOTS = {"lost_toy": LOST_TOY, "stuck_kite": STUCK_KITE, "brave": BRAVE, "picnic": PICNIC, "rescue": RESCUE}


def all_templates() -> list[str]:
    """Every sentence template of every plot, once each, in a fixed order."""
    return list(dict.fromkeys(t for plot in PLOTS.values() for b in plot for t in b.templates))
