"""The raw material of the demo corpus: names, places and nine kinds of news story.

A story template is plain text with two kinds of markup:

* ``{slot}``: filled from the article's cast (people, places, numbers); see `bart_opt.demo.corpus`;
* ``[ ... ]``: a detail. It may appear in the article and never appears in the highlights, so a
  highlight is its lead sentence with the details left out: a compression made of the
  article's own words.

Each `Topic` has lead stories (three sentences that open the article and that the highlights
summarize, in order) and body sentences (background, quotes, reactions) that follow the lead.
`Topic.slots(rng)` draws the topic's own slot values (teams, amounts, findings, ...).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

MALE_NAMES = (
    "James", "David", "Michael", "Daniel", "Thomas", "Robert", "Peter", "Mark", "Paul", "Andrew",
    "Samuel", "Joseph", "Martin", "Simon", "Oliver", "Henry", "Patrick", "Ahmed", "Carlos", "Luca",
    "Hugo", "Liam", "Ethan", "Omar", "Ivan", "Felix", "Marcus", "Victor", "Adam", "Ben",
)  # fmt: skip
FEMALE_NAMES = (
    "Sarah", "Emma", "Laura", "Anna", "Rachel", "Helen", "Claire", "Julia", "Maria", "Sophie",
    "Grace", "Chloe", "Hannah", "Lucy", "Fatima", "Elena", "Amira", "Nina", "Olivia", "Rosa",
    "Alice", "Megan", "Ruth", "Karen", "Diana", "Leila", "Ines", "Mia", "Zoe", "Jane",
)  # fmt: skip
LAST_NAMES = (
    "Smith", "Jones", "Taylor", "Brown", "Wilson", "Evans", "Walker", "Wright", "Robinson", "Thompson",
    "White", "Hughes", "Edwards", "Green", "Hall", "Wood", "Harris", "Clarke", "Patel", "Khan",
    "Murphy", "Kelly", "Ryan", "Garcia", "Martin", "Moreau", "Fischer", "Weber", "Rossi", "Silva",
    "Novak", "Berg", "Chen", "Nguyen", "Okafor", "Mensah", "Cohen", "Ali", "Lopez", "Baker",
    "Turner", "Parker", "Collins", "Stewart", "Morris", "Cooper", "Ward", "Bell", "Foster", "Mason",
)  # fmt: skip
# (city, country, currency symbol, a newspaper)
CITIES = (
    ("Leeds", "England", "£", "Yorkshire Post"), ("Bristol", "England", "£", "Bristol Post"),
    ("Manchester", "England", "£", "Manchester Evening News"), ("Glasgow", "Scotland", "£", "Glasgow Herald"),
    ("Cardiff", "Wales", "£", "Western Mail"), ("Belfast", "Northern Ireland", "£", "Belfast Telegraph"),
    ("Cork", "Ireland", "€", "Irish Examiner"), ("Dublin", "Ireland", "€", "Irish Times"),
    ("Lyon", "France", "€", "Le Progrès"), ("Hamburg", "Germany", "€", "Hamburger Abendblatt"),
    ("Munich", "Germany", "€", "Münchner Merkur"), ("Porto", "Portugal", "€", "Jornal de Notícias"),
    ("Denver", "the United States", "$", "Denver Post"), ("Boston", "the United States", "$", "Boston Globe"),
    ("Seattle", "the United States", "$", "Seattle Times"), ("Atlanta", "the United States", "$", "Atlanta Journal"),
    ("Toronto", "Canada", "$", "Toronto Star"), ("Calgary", "Canada", "$", "Calgary Herald"),
    ("Perth", "Australia", "$", "West Australian"), ("Brisbane", "Australia", "$", "Courier-Mail"),
)  # fmt: skip
DISTRICTS = ("north", "south", "east", "west", "old town", "harbour", "university", "riverside")
STREETS = ("High Street", "Station Road", "Mill Lane", "Church Street", "Park Avenue", "King Street",
           "Bridge Road", "Market Square", "Victoria Road", "Queen Street")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December")
ORDINALS = ("second", "third", "fourth", "fifth", "sixth")
NUMBER_WORDS = ("two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")


def number_word(rng: random.Random) -> str:
    """A small count written out, as news style wants for counts under 13."""
    return rng.choice(NUMBER_WORDS)


def thousands(rng: random.Random, low: int, high: int, step: int = 1) -> str:
    """A whole number in [low, high] on a multiple of `step`, with thousands separators."""
    return f"{rng.randrange(low, high + 1, step):,}"


def millions(rng: random.Random, low: float, high: float) -> str:
    """An amount such as "4.2 million" (the currency symbol is the template's)."""
    return f"{rng.uniform(low, high):.1f} million"


@dataclass(frozen=True)
class Topic:
    """One kind of story: lead stories (three sentence templates each) and body sentences."""

    name: str
    roles: tuple[str, ...]
    leads: tuple[tuple[str, str, str], ...]
    body: tuple[str, ...]
    slots: Callable[[random.Random], dict[str, str]]


def _crime_slots(rng: random.Random) -> dict[str, str]:
    crime, loot = rng.choice((
        ("a series of burglaries", "jewellery and watches"),
        ("an armed robbery at a petrol station", "a large amount of cash"),
        ("the theft of laptops from a primary school", "dozens of laptops"),
        ("a fraud that cost pensioners their savings", "bank cards and fake documents"),
        ("the theft of farm machinery", "two stolen tractors"),
    ))  # fmt: skip
    return {"crime": crime, "loot": loot, "age": str(rng.randint(19, 64)), "count": number_word(rng),
            "weeks": str(rng.randint(3, 14)), "detectives": str(rng.randint(6, 40)),
            "value": thousands(rng, 5000, 250000, 500)}


CRIME = Topic(
    name="crime",
    roles=("a police spokesman", "a senior detective", "the head of the local police", "a police spokeswoman"),
    leads=(
        ("Police in {city}[ on {day}] arrested a {age}-year-old {man} in connection with {crime}[, officials said].",
         "{Name}[, who lives in the {district} area of the city,] was held after officers searched {count} properties.",
         "{Name2}, {role2}, said the arrest followed a {weeks}-week investigation[ by a team of {detectives} detectives]."),
        ("A {age}-year-old {man} has been charged with {crime} in {city}[, police said on {day}].",
         "Officers found {loot}[ worth an estimated {currency}{value}] at a house belonging to {Name}.",
         "{Last} is due to appear before {city} magistrates on {day2}[ and has not yet entered a plea]."),
    ),
    body=(
        "{Last2} said detectives had received a number of calls from members of the public.",
        '"We are grateful to the people of {city} for their help," {Last2} told reporters.',
        "Neighbours described {Last} as a quiet {man} who kept to {himself}.",
        "A second suspect, aged {age3}, was questioned and released without charge.",
        "Police have asked anyone with more information to contact them.",
        "The case has caused concern among shop owners in the {district} area.",
        "Mr. {Last3}, who runs a shop nearby, said he was relieved that someone had been arrested.",
    ),
    slots=_crime_slots,
)


def _fire_slots(rng: random.Random) -> dict[str, str]:
    return {"building": rng.choice(("warehouse", "block of flats", "hotel", "furniture factory", "shopping centre",
                                    "primary school", "restaurant")),
            "firefighters": str(rng.randrange(30, 130, 5)), "hours": number_word(rng),
            "evacuated": str(rng.randrange(20, 400, 10)), "engines": str(rng.randint(4, 25))}


FIRE = Topic(
    name="fire",
    roles=("the chief fire officer", "a fire service spokesman", "a spokeswoman for the fire service"),
    leads=(
        ("A fire destroyed a {building} on {street} in {city}[ early on {day}], forcing {evacuated} people to leave the area.",
         "The blaze[, which started shortly after midnight,] took crews {hours} hours to bring under control.",
         "No one was injured[, but two firefighters were treated for smoke inhalation]."),
        ("More than {firefighters} firefighters were called to a large fire at a {building} in {city}[ on {day} night].",
         "Thick smoke could be seen across the city[ and residents were told to keep their windows closed].",
         "The cause of the fire is not yet known[, {role2} said]."),
    ),
    body=(
        "{Last2}, {role2}, said crews had worked through the night to stop the fire from spreading.",
        '"It was the biggest fire I have seen in twenty years," said {Last}, who lives nearby.',
        "Roads around {street} remained closed on {day2} morning.",
        "At its height, {engines} fire engines were at the scene.",
        "Investigators will examine the site once it is safe to do so.",
        "The {building} had been empty for several months, according to neighbours.",
        "{Last} said {he} had been woken by the sound of breaking glass.",
    ),
    slots=_fire_slots,
)


def _storm_slots(rng: random.Random) -> dict[str, str]:
    return {"storm": rng.choice(MALE_NAMES + FEMALE_NAMES), "wind": str(rng.randrange(60, 115, 5)),
            "homes": thousands(rng, 2000, 90000, 100), "rain": str(rng.randint(40, 160)),
            "hours": str(rng.randint(6, 36)), "colour": rng.choice(("yellow", "amber", "red")),
            "ordinal": rng.choice(ORDINALS)}


STORM = Topic(
    name="storm",
    roles=("the head of the regional emergency service", "a spokesman for the national weather service",
           "the regional transport minister"),
    leads=(
        ("Storm {storm} brought winds of up to {wind} miles per hour to {city}[ on {day}], cutting power to {homes} homes.",
         "Forecasters said {rain} millimetres of rain fell in {hours} hours[, more than the usual amount for the whole month].",
         "{Name2}, {role2}, urged people to avoid all but essential travel[ until the weekend]."),
        ("Thousands of homes in {city} were left without power after Storm {storm} swept across {country}[ on {day}].",
         "Trees were brought down across the region[ and several main roads were blocked].",
         "Schools in {city} will remain closed on {day2}[, officials said]."),
    ),
    body=(
        "Engineers worked through the night to restore power to the worst affected areas.",
        "The national weather service issued a {colour} warning for wind and rain.",
        '"We have not seen a storm like this for a long time," said {Last}, a farmer from outside {city}.',
        "Several flights from {city} airport were cancelled or delayed.",
        "Insurance companies said it was too early to estimate the cost of the damage.",
        "Storm {storm} is the {ordinal} named storm of the season.",
        "{Last} said {his} garden wall had been knocked down by the wind.",
    ),
    slots=_storm_slots,
)


def _football_slots(rng: random.Random) -> dict[str, str]:
    winner = rng.randint(2, 5)
    rival_city = rng.choice(CITIES)[0]
    return {"team": "{city} " + rng.choice(("United", "City", "Rovers", "Athletic")),
            "rival": rival_city + " " + rng.choice(("Town", "Wanderers", "Albion", "FC")),
            "score": f"{winner}-{rng.randint(0, winner - 1)}", "minute": str(rng.randint(3, 88)),
            "position": rng.choice(("top of the league", "second in the league", "into the top four")),
            "crowd": thousands(rng, 8000, 52000, 100), "wins": number_word(rng), "goals": str(rng.randint(5, 24))}


FOOTBALL = Topic(
    name="football",
    roles=("the {team} manager", "the {team} coach", "the {team} captain"),
    leads=(
        ("{team} beat {rival} {score}[ on {day}] to move {position}.",
         "{Name} opened the scoring after {minute} minutes[ with a shot from the edge of the area].",
         "{Name2}, {role2}, said the players had deserved the win[ after a difficult month]."),
        ("{Name} scored twice as {team} beat {rival} {score}[ in front of {crowd} fans].",
         "{rival} had a player sent off[ shortly before half-time] and never recovered.",
         "The result leaves {rival} in the bottom three[ with ten games left to play]."),
    ),
    body=(
        '"We worked hard all week and it showed," {Last2} told reporters after the game.',
        "{team} have now won {wins} of their last twelve matches.",
        "The two sides meet again in the cup next month.",
        "The crowd of {crowd} was the biggest at the ground this season.",
        "{Last}, who joined the club last summer, now has {goals} goals this season.",
        "{rival} said they would not appeal against the red card.",
        "Tickets for the next home game went on sale on {day2}.",
    ),
    slots=_football_slots,
)


def _company_slots(rng: random.Random) -> dict[str, str]:
    company, product, sector = rng.choice((
        ("{Last} Foods", "frozen meals", "food"), ("Northgate Energy", "solar panels", "energy"),
        ("Riverside Motors", "electric vans", "car"), ("Bluebell Toys", "board games", "toy"),
        ("Harbour Steel", "steel pipes", "engineering"), ("Crown Textiles", "school uniforms", "clothing"),
    ))  # fmt: skip
    return {"company": company, "product": product, "sector": sector, "percent": str(rng.randint(3, 40)),
            "amount": millions(rng, 1.5, 90.0), "jobs": thousands(rng, 40, 900, 10),
            "staff": thousands(rng, 1000, 12000, 100), "ordinal": rng.choice(ORDINALS),
            "sites": number_word(rng), "year": str(rng.randint(1890, 2005)), "month": rng.choice(MONTHS)}


COMPANY = Topic(
    name="company",
    roles=("the chief executive", "the company's finance director", "the chairman of the board"),
    leads=(
        ("{company} said[ on {day}] that its profits rose {percent} percent to {currency}{amount}[ in the first half of the year].",
         "The {sector} group[, which is based in {city},] said demand for its {product} had been stronger than expected.",
         "{Name2}, {role2}, said the company would open {sites} new sites[ over the next two years]."),
        ("{company} will cut {jobs} jobs[ at its factory in {city}] after sales fell for a {ordinal} year in a row.",
         "The company[, which employs {staff} people in {country},] blamed higher energy costs[ and weak demand for its {product}].",
         "Unions said they would fight the plan[ and called for urgent talks with the management]."),
    ),
    body=(
        "{company} was founded in {city} in {year}.",
        '"These are difficult times for the whole industry," {Last2} said.',
        "The company will publish its full results in {month}.",
        "Analysts said the figures were better than many had feared.",
        "{Last}, who has worked at the factory for twenty years, said staff had not been told.",
        "Shares in {company} were little changed in early trading on {day2}.",
    ),
    slots=_company_slots,
)


def _council_slots(rng: random.Random) -> dict[str, str]:
    plan = rng.choice((
        "ban cars from the city centre on Sundays", "build {homes} new homes on the site of the old airport",
        "raise parking charges by {percent} percent", "close three public libraries",
        "plant ten thousand trees over the next five years", "build a new swimming pool in the {district} area",
    ))  # fmt: skip
    votes_for = rng.randint(20, 45)
    return {"plan": plan, "homes": thousands(rng, 200, 3000, 50), "percent": str(rng.randint(5, 30)),
            "for": str(votes_for), "against": str(rng.randint(5, votes_for - 1)), "hours": number_word(rng),
            "months": str(rng.randint(7, 40)), "month": rng.choice(MONTHS)}


COUNCIL = Topic(
    name="council",
    roles=("the leader of the council", "the deputy mayor", "the head of the city's planning committee"),
    leads=(
        ("Councillors in {city} voted[ on {day}] to {plan}[ despite strong opposition from local businesses].",
         "The plan was approved by {for} votes to {against}[ after a debate that lasted {hours} hours].",
         "{Name2}, {role2}, said the decision would make the city a better place to live."),
        ("The mayor of {city}, {Name2}, has resigned[ after {months} months in office], saying {he2} wanted to spend more time with {his2} family.",
         "{Last2} announced the decision in a short statement[ on {day}].",
         "An election to choose a new mayor will be held in {month}[, officials said]."),
    ),
    body=(
        "Opposition councillors said the plan had been rushed through.",
        '"People in {city} deserve better than this," said {Last}, who led a campaign against the plan.',
        "The council will hold a public meeting on {day2} evening.",
        "Local businesses said they had not been consulted.",
        "The decision can still be challenged in the courts.",
        "{Last} said more than {homes} people had signed a petition.",
    ),
    slots=_council_slots,
)


def _study_slots(rng: random.Random) -> dict[str, str]:
    finding, subjects = rng.choice((
        ("people who walk for thirty minutes a day sleep better", "adults"),
        ("children who read at home do better at school", "children"),
        ("honey bees can recognise human faces", "bees"),
        ("drinking coffee may protect the liver", "volunteers"),
        ("city parks can lower summer temperatures by up to four degrees", "neighbourhoods"),
        ("older people who learn a new language stay sharper for longer", "pensioners"),
    ))  # fmt: skip
    return {"finding": finding, "subjects": subjects, "participants": thousands(rng, 120, 9000, 10),
            "years": number_word(rng), "journal": rng.choice(("Nature", "Science", "The Lancet", "Cell Reports"))}


STUDY = Topic(
    name="study",
    roles=("a professor of medicine", "the lead author of the study", "a researcher at the university"),
    leads=(
        ("Scientists at the University of {city} have found that {finding}[, according to a study published on {day}].",
         "The researchers[, led by Dr. {Name2},] studied {participants} {subjects} over {years} years.",
         "{Last2} said the results were surprising[ and that more work was needed]."),
        ("A new study[ from {country}] suggests that {finding}.",
         "The team[ at the {city} Institute of Health] followed {participants} {subjects}[ for {years} years].",
         "The findings were published in the journal {journal}[ on {day}]."),
    ),
    body=(
        '"We did not expect the effect to be so strong," said Dr. {Last2}.',
        "Other scientists said the study was small and should be repeated.",
        "The work was paid for by a national research council.",
        "{Last}, a researcher who was not involved in the study, called it an important step.",
        "The team now plans a larger study with volunteers from {country}.",
        "Earlier studies had reached different conclusions.",
    ),
    slots=_study_slots,
)


def _hospital_slots(rng: random.Random) -> dict[str, str]:
    return {"ward": rng.choice(("cancer", "children's heart", "stroke", "eye", "maternity")),
            "treatment": rng.choice(("knee operations", "cancer scans", "hip replacements", "eye surgery")),
            "patients": thousands(rng, 400, 30000, 100), "amount": millions(rng, 2.0, 60.0),
            "weeks": str(rng.randint(18, 70)), "staff": str(rng.randrange(20, 300, 5))}


HOSPITAL = Topic(
    name="hospital",
    roles=("a senior doctor at the hospital", "the hospital's medical director", "the regional health minister"),
    leads=(
        ("A hospital in {city} has opened a new {ward} unit[ that will treat up to {patients} patients a year].",
         "The unit[, which cost {currency}{amount} to build,] is the first of its kind in {country}.",
         "{Name2}, {role2}, said it would cut waiting times[ for thousands of families]."),
        ("Doctors in {city} have warned that waiting times for {treatment} have reached {weeks} weeks[, the longest on record].",
         "Figures released[ on {day}] show that {patients} people are now waiting for treatment[ in the region].",
         "{Name2}, {role2}, said hospitals needed more staff[ to meet the demand]."),
    ),
    body=(
        '"Every week of waiting is a week of pain for our patients," said {Last2}.',
        "The hospital plans to hire {staff} more nurses this year.",
        "{Last}, who has waited eight months for treatment, said {he} could no longer work.",
        "The government said it was spending record amounts on health care.",
        "Patient groups welcomed the news but said more needed to be done.",
        "The unit will be open seven days a week.",
    ),
    slots=_hospital_slots,
)


def _rescue_slots(rng: random.Random) -> dict[str, str]:
    return {"walkers": number_word(rng), "hours": number_word(rng), "age": str(rng.randint(18, 75)),
            "hill": rng.choice(("Ben Lomond", "Snowdon", "Scafell Pike", "Mount Hood", "Table Mountain",
                                "Helvellyn")),
            "rescuers": str(rng.randint(12, 60))}


RESCUE = Topic(
    name="rescue",
    roles=("the leader of the rescue team", "a coastguard spokesman", "a lifeboat volunteer"),
    leads=(
        ("{walkers} walkers were rescued from {hill}[ on {day}] after becoming lost in thick fog.",
         "Rescue teams[ from {city}] found the group[ at around midnight] after a search lasting {hours} hours.",
         "All of the walkers were taken to hospital[ as a precaution], but none was seriously hurt."),
        ("A {age}-year-old {man} was rescued after {his} boat overturned off the coast near {city}[ on {day}].",
         "{Name}[, an experienced sailor,] spent {hours} hours in the water before a lifeboat crew reached {him}.",
         "{Name2}, {role2}, said {Last} had been very lucky to survive."),
    ),
    body=(
        "{rescuers} volunteers took part in the search.",
        '"Conditions were very difficult," said {Last2}.',
        "The weather had changed quickly during the afternoon.",
        "{Last} later thanked the rescuers in a message to the local newspaper.",
        "Rescue services urged people to check the forecast before setting out.",
        "A helicopter was also called in to help with the search.",
    ),
    slots=_rescue_slots,
)


def _transport_slots(rng: random.Random) -> dict[str, str]:
    return {"city2": rng.choice(CITIES)[0], "days": number_word(rng), "years": number_word(rng),
            "length": thousands(rng, 300, 4000, 10), "amount": millions(rng, 20.0, 900.0),
            "minutes": str(rng.randrange(10, 50, 5)), "month": rng.choice(MONTHS)}


TRANSPORT = Topic(
    name="transport",
    roles=("the general secretary of the union", "the transport minister", "a spokeswoman for the rail operator"),
    leads=(
        ("Train drivers in {country} will strike for {days} days[ next month] in a dispute over pay[, their union said].",
         "The strike will affect services between {city} and {city2}[ and on most local lines].",
         "{Name2}, {role2}, said the union had been left with no choice[ after months of talks]."),
        ("A new bridge linking {city} and {city2} opened to traffic on {day}[, {years} years after work began].",
         "The bridge[, which is {length} metres long,] cost {currency}{amount} to build.",
         "{Name2}, {role2}, said it would cut journey times between the two cities by {minutes} minutes."),
    ),
    body=(
        "Passengers were advised to check before they travel.",
        '"We want a fair deal, nothing more," said {Last2}.',
        "{Last}, who travels to work by train every day, said {he} would have to work from home.",
        "The last strike, in {month}, cost businesses millions.",
        "Officials expect more than ten thousand vehicles a day to use the new route.",
        "Talks are expected to continue later this week.",
    ),
    slots=_transport_slots,
)

TOPICS = (CRIME, FIRE, STORM, FOOTBALL, COMPANY, COUNCIL, STUDY, HOSPITAL, RESCUE, TRANSPORT)

# Sentences that fit after any lead.
GENERIC_BODY = (
    "The story was first reported by the {paper}.",
    "{city} has a population of about {population} people.",
    "Local officials are expected to give more details later this week.",
    "It is not the first time {city} has made the news this year.",
    "More information is expected to be released on {day2}.",
    "The {paper} said it would publish a full report on {day2}.",
    "Residents of the {district} area said they had heard the news from friends.",
    "Mr. {Last3}, who has lived in {city} all his life, said he could not remember anything like it.",
)
